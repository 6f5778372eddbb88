// benchfarm web: keeps the page current by polling the JSON API; no page reload.
// Every value from the store is written with textContent (never as HTML).
"use strict";

const POLL_MS = 2000;
// the run statuses, in the store's order (db.records.RUN_STATUSES), as the page names them
const STATUSES = document.body.dataset.statuses.split(" ");  // the script is deferred
const PARTS = ["done", "failed", "running", "pending"];

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function cells(tr, values) {
  for (const [text, cls] of values) tr.appendChild(el("td", text, cls));
  return tr;
}

function when(iso) {
  return iso ? iso.replace("T", " ").slice(0, 19) : "";
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  const whole = Math.round(seconds);
  const hours = Math.floor(whole / 3600);
  const minutes = Math.floor((whole % 3600) / 60);
  const secs = whole % 60;
  const two = (n) => String(n).padStart(2, "0");
  return hours ? `${hours} h ${two(minutes)} m` : `${minutes} m ${two(secs)} s`;
}

function num(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (typeof value !== "number" || Number.isInteger(value)) return String(value);
  return Math.abs(value) >= 1e-3 ? String(Number(value.toPrecision(3))) : value.toExponential(2);
}

function experimentLink(name) {
  const a = el("a", name);
  a.href = "/experiments/" + encodeURIComponent(name);
  return a;
}

function progress(job) {
  const box = el("div");
  if (!job.placements.length) {
    box.appendChild(el("span", "no matrix recorded yet", "note"));
    return box;
  }
  for (const p of job.placements) {
    const line = el("div", null, "placement");
    line.dataset.placement = p.placement;
    line.appendChild(el("span", p.placement, "name"));
    const bar = el("span", null, "progress-bar");
    bar.title = `${p.done} done, ${p.failed} failed, ${p.running} running, ${p.pending} pending of ${p.total}`;
    for (const part of PARTS) {
      const seg = el("span", null, part);
      seg.style.width = (p.total ? (100 * p[part]) / p.total : 0) + "%";
      bar.appendChild(seg);
    }
    line.appendChild(bar);
    line.appendChild(el("span", ` ${p.done} done · ${p.failed} failed · ${p.running} running · ${p.pending} pending of ${p.total}`, "counts"));
    box.appendChild(line);
  }
  return box;
}

function replaceRows(tableId, rows, empty, columns) {
  const body = document.querySelector(`#${tableId} tbody`);
  if (!body) return;
  if (!rows.length) {
    const tr = el("tr");
    const td = el("td", empty, "text");
    td.colSpan = columns;
    tr.appendChild(td);
    rows = [tr];
  }
  body.replaceChildren(...rows);
}

function boardRow(b) {
  const tr = el("tr");
  tr.dataset.board = b.name;
  const run = (b.experiment || "") + (b.run_key ? " / " + b.run_key.slice(0, 12) : "");
  const lost = b.lost_in_a_row ? ` (${b.lost_in_a_row} runs lost in a row)` : "";
  const r = b.reservation;
  const reserved = r ? `${r.owner} until ${when(r.ends)}` + (r.reason ? ` (${r.reason})` : "") : "";
  cells(tr, [[b.name, "text"], [b.state, "text state state-" + b.state],
             [(b.reason || "") + lost, "text reason"],
             [b.since ? `${when(b.since)} by ${b.changed_by}` : "", "text"],
             [b.activity, "text activity-" + b.activity], [b.holder || "", "text"],
             [run, "text"], [reserved, "text reservation"]]);
  const health = el("td", null, "health");
  for (const h of b.health) {
    health.appendChild(el("div", `${when(h.checked_at)} ${h.summary}`,
                          h.ok ? "health-ok" : "health-failed"));
  }
  tr.appendChild(health);
  const events = el("td", null, "text events");
  for (const e of b.events) {
    events.appendChild(el("div", `${when(e.at)} ${e.state} by ${e.changed_by}` +
                          (e.reason ? `: ${e.reason}` : "")));
  }
  tr.appendChild(events);
  cells(tr, [[b.cls || ""], [b.arch || ""],
             [b.emulated === null ? "" : (b.emulated ? "yes" : "no")],
             [when(b.last_run_at) + (b.last_status ? ` (${b.last_status})` : "")]]);
  const failures = el("td", null, "failure");
  for (const f of b.failures) {
    failures.appendChild(el("div", `run ${f.run_id} (${f.experiment}, ${when(f.finished_at)}): ${f.error || ""}`));
  }
  tr.appendChild(failures);
  return tr;
}

function jobRow(j, active) {
  const tr = el("tr");
  tr.dataset.job = j.id;
  tr.appendChild(el("td", j.id));
  const name = el("td", null, "text");
  name.appendChild(experimentLink(j.experiment));
  tr.appendChild(name);
  cells(tr, [[j.state, "job-" + j.state], [j.owner, "text"], [j.priority], [j.kind]]);
  if (active) {
    const bars = el("td");
    bars.appendChild(progress(j));
    tr.appendChild(bars);
    cells(tr, [[duration(j.elapsed_s)], [duration(j.remaining_s)], [j.holder || "", "text"],
               [j.message || "", "text why"]]);
  } else {
    cells(tr, [[when(j.finished_at)], [duration(j.elapsed_s)], [j.message || "", "text"]]);
  }
  return tr;
}

function experimentRow(e) {
  const tr = el("tr");
  tr.dataset.experiment = e.name;
  const name = el("td", null, "text");
  name.appendChild(experimentLink(e.name));
  tr.appendChild(name);
  cells(tr, [[e.total], ...STATUSES.map((s) => [e.counts[s]]), [when(e.updated_at)]]);
  return tr;
}

function jobSummary(j) {
  const box = el("div");
  const line = el("p");
  line.appendChild(document.createTextNode(`job ${j.id}: `));
  line.appendChild(el("span", j.state, "job-" + j.state));
  let rest = ` · owner ${j.owner} · priority ${j.priority} · elapsed ${duration(j.elapsed_s)}`;
  if (j.remaining_s !== null) rest += ` · about ${duration(j.remaining_s)} to go`;
  if (j.message) rest += ` · ${j.message}`;
  line.appendChild(document.createTextNode(rest));
  box.appendChild(line);
  box.appendChild(progress(j));
  return box;
}

const RESULT_KEYS = ["command", "policy", "k", "device", "revision", "runs", "decode_ms_per_token",
                     "attn_ms_per_token", "overhead_ms", "recall", "ppl"];

function showExperiment(x) {
  const counts = [cells(el("tr"), [["all", "text"], ...STATUSES.map((s) => [x.counts[s]])])];
  for (const [device, c] of Object.entries(x.devices)) {
    counts.push(cells(el("tr"), [[device, "text"], ...STATUSES.map((s) => [c[s]])]));
  }
  replaceRows("counts", counts, "", STATUSES.length + 1);
  const job = document.getElementById("job");
  job.replaceChildren(x.job ? jobSummary(x.job)
                            : el("p", "no job recorded for this experiment", "note"));
  const label = (g) => x.revision_labels[g.revision] || g.revision || "";
  const rows = x.groups.map((g) => cells(el("tr"), RESULT_KEYS.map(
    (k) => (k === "revision" ? [label(g), "text revision"] : [num(g[k])]))));
  replaceRows("results", rows, "no ok runs yet", RESULT_KEYS.length);
}

async function getJson(path) {
  const response = await fetch(path, {credentials: "same-origin", cache: "no-store"});
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

async function refresh() {
  const page = document.body.dataset.page;
  const query = window.location.search;  // the page's filters and paging, applied alike
  if (page === "index") {
    const [boards, jobs, experiments] = await Promise.all(
      [getJson("/api/boards" + query), getJson("/api/jobs" + query),
       getJson("/api/experiments" + query)]);
    replaceRows("boards", boards.map(boardRow), "no boards in the store yet", 15);
    const active = jobs.filter((j) => j.state === "queued" || j.state === "running");
    const finished = jobs.filter((j) => !(j.state === "queued" || j.state === "running"));
    replaceRows("jobs", active.map((j) => jobRow(j, true)), "no job queued or running", 11);
    replaceRows("finished", finished.map((j) => jobRow(j, false)), "no finished job", 9);
    replaceRows("experiments", experiments.map(experimentRow), "no experiments stored yet",
                STATUSES.length + 3);
  } else if (page === "experiments") {
    const experiments = await getJson("/api/experiments" + query);
    replaceRows("experiments", experiments.map(experimentRow), "no experiments stored yet",
                STATUSES.length + 3);
  } else if (page === "experiment") {
    const name = document.body.dataset.experiment;
    showExperiment(await getJson("/api/experiments/" + encodeURIComponent(name)));
  } else {
    return;
  }
  document.getElementById("live").textContent = "updated " + new Date().toISOString()
    .replace("T", " ").slice(0, 19) + " UTC";
}

async function loop() {
  try {
    await refresh();
  } catch (error) {
    const live = document.getElementById("live");
    if (live) live.textContent = "cannot update: " + error.message + " (retrying)";
  }
  setTimeout(loop, POLL_MS);
}

document.addEventListener("DOMContentLoaded", () => setTimeout(loop, POLL_MS));
