"""The dashboard's first view of an experiment, timed: what `/experiments/NAME` computes when it
has no page kept (after new runs land): the experiment's summary and history
(``FarmData.experiment``) and its report's sections (``FarmData.report_html``), without the
HTTP server. Each repeat is a fresh process, so that nothing is kept between them.

Two checkouts can be timed side by side (``--against``), in rounds that alternate which goes
first: a change to the read path against the commit before it, each on its own store (a store
migrated by the newer checkout cannot be opened by the older one: copy it first).

    .venv/bin/python bench/first_view.py --db sqlite:////tmp/benchfarm-scale/sqlite-100x/store.db \\
        nightly [--repeats 3] [--checkout DIR] [--against DIR --against-db URL]

The stores of bench/scale.py hold ``nightly`` (50 configs x 1,000 revisions at 100x).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Run in the checkout timed (its own modules first on the path); prints one JSON line.
TIMED = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from harness.web.data import FarmData
farm = FarmData(sys.argv[2], Path(sys.argv[1]) / "claims")
started = time.perf_counter()
farm.experiment(sys.argv[3])
summary = time.perf_counter()
farm.report_html(sys.argv[3])
done = time.perf_counter()
print(json.dumps({"experiment_s": summary - started, "report_s": done - summary,
                  "total_s": done - started}))
"""


def timed(checkout: Path, url: str, experiment: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", TIMED, str(checkout), url, experiment],
                          cwd=checkout, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"first_view: the view of {experiment!r} failed in {checkout}:\n"
                         f"{done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(name: str, times: list[dict[str, float]]) -> str:
    parts = []
    for key in ("experiment_s", "report_s", "total_s"):
        values = [t[key] for t in times]
        parts.append(f"{key[:-2]} {statistics.median(values):.2f} s "
                     f"[{min(values):.2f}, {max(values):.2f}]")
    return f"{name}: " + ", ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment")
    parser.add_argument("--db", required=True, help="the store's SQLAlchemy URL")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--checkout", type=Path, default=REPO, help="the code timed")
    parser.add_argument("--against", type=Path, help="a second checkout, timed in turn")
    parser.add_argument("--against-db", help="its store (default: --db)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be 1 or more")
    sides = [(str(args.checkout), args.checkout, args.db)]
    if args.against:
        sides.append((str(args.against), args.against, args.against_db or args.db))
    times: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in sides}
    for round_number in range(1, args.repeats + 1):
        for name, checkout, url in (sides if round_number % 2 else sides[::-1]):
            result = timed(checkout, url, args.experiment)
            times[name].append(result)
            print(f"round {round_number} {name}: {result['total_s']:.2f} s", flush=True)
    for name, _, _ in sides:
        print(summary(name, times[name]))
    if args.against:
        ratio = (statistics.median(t["total_s"] for t in times[str(args.checkout)])
                 / statistics.median(t["total_s"] for t in times[str(args.against)]))
        print(f"total, {args.checkout} / {args.against}: {ratio:.2f}x (medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
