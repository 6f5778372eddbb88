"""Experiment specs (``specs/*.toml``): load, validate, and turn into plain records.

A spec names a model, the workloads with their axes, the engines and each engine's axes (its own
section), the engine revisions, the devices, and how often to repeat. Every error names the
file, the key and what is allowed, and is raised before anything runs. Any axis may be written
as a scalar or a list of values.

This module reads the file and its top-level keys; the ``[[workload]]`` tables are validated by
``harness.spec.workloads`` against the workload kinds, and each engine's section (lmc's
``[engine]``, ``[llama-bench]``) by its adapter (``harness.engines``), all with
``devices.checker.Checker``.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devices.checker import Checker
from devices.files import UnreadableToml, loads_toml, read_json, read_toml_text
from devices.isa import BY_NAME
from harness.engines import DEFAULT_ENGINE, ENGINES
from harness.errors import InputError
from harness.spec.targets import TargetRefused, checked_url
from harness.spec.workloads import WorkloadAxes, parse_workloads
from harness.workloads.kinds import KINDS

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
SPEC_KEYS = {
    "name", "description", "model", "devices", "revisions", "repeats", "warmups", "cooldown_s",
    "retries", "backoff_s", "order_seed", "timeout_s", "workload", "engines", "notify",
    "isa", "track",
}


def top_level_keys() -> set[str]:
    """A spec's keys: its own, and each registered engine's section."""
    return SPEC_KEYS | {adapter.section for adapter in ENGINES.values()}

__all__ = ["Spec", "load_spec", "parse_spec"]


@dataclass(frozen=True)
class Spec:
    path: Path
    text: str
    hash: str  # sha256 of the spec text
    name: str
    description: str
    model: Path | None  # None only when no workload reads a model (attn-bench)
    devices: list[str]  # device names or device classes
    revisions: list[str]  # git revisions of this repository, or its working tree
    repeats: int
    warmups: int
    cooldown_s: float
    retries: int  # more tries of a run whose board was lost
    backoff_s: float  # first wait before a lost board is tried again; doubles every time
    order_seed: int
    timeout_s: float
    workloads: list[WorkloadAxes] = field(default_factory=list)
    engines: list[str] = field(default_factory=lambda: [DEFAULT_ENGINE])
    # engine name -> its axes (the record its adapter made of its section)
    sections: dict[str, Any] = field(default_factory=dict)
    # [notify]: where the job's end is announced ({"url": [...]}: http(s) URLs only)
    notify: dict[str, list[str]] = field(default_factory=dict)
    # instruction-set levels pinned (devices.isa), at most one per architecture; a board of an
    # architecture not named here gets the highest level it supports
    isa: dict[str, str] = field(default_factory=dict)
    # [track] confirm_budget_s: the measuring time `track` may spend confirming each step
    # before it blames a commit (0: no confirmation); `track --confirm-budget` overrides it
    confirm_budget_s: float = 0.0
    # [track] ends_only: `track` measures only a night's newest commit (`--ends-only` sets it)
    ends_only: bool = False

    def axes(self, engine: str) -> Any:
        """The axes of one of the spec's engines."""
        return self.sections[engine]


# The bounds of a spec's durations: a run's timeout (a day: the longest benchmark run; 1e300
# overflowed the deadlines into a "lost board"), the pause between runs and before a retry
# (an hour: cooldown_s = 1e9 hung silently after the first run).
MAX_TIMEOUT_S = 86400.0
MAX_PAUSE_S = 3600.0


def _check_context(check: Checker, workloads: list[WorkloadAxes], config: Path) -> None:
    """Prompt lengths (``ctx``, ``length``) the model cannot take are refused now: its
    ``max_position_embeddings`` bounds them (every run of the matrix failed in the engine)."""
    try:
        document = read_json(config)
    except (OSError, ValueError):
        return  # harness.plan.inputs names the problem with the file
    text = document.get("text_config", document) if isinstance(document, dict) else None
    limit = text.get("max_position_embeddings") if isinstance(text, dict) else None
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        return
    for index, workload in enumerate(workloads):
        if not KINDS[workload.kind].uses_model:
            continue  # attn-bench's synthetic attention has no model
        for axis in ("ctx", "length"):
            too_long = [n for n in workload.axes.get(axis, []) if n > limit]
            if too_long:
                raise check.fail(f"workload[{index}].{axis}",
                                 f"{too_long[0]} is more than the model's "
                                 f"max_position_embeddings ({limit}, in {config})")


def _listing(names: list[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file; raise InputError naming the file and key on any problem."""
    path = Path(path)
    try:
        text = read_toml_text(path, "spec")
    except UnreadableToml as exc:
        raise InputError(str(exc)) from None
    return parse_spec(text, path)


def parse_spec(text: str, path: Path) -> Spec:
    try:
        data = loads_toml(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML: {exc}") from exc
    check = Checker(path, InputError, "spec")
    check.table(data, "", top_level_keys())

    if "name" not in data:
        raise check.fail("name", "required (the experiment name)")
    name = check.scalar(data["name"], "name", "str")
    if not NAME_RE.match(name):
        raise check.fail("name", f"{name!r} is not allowed; use [a-z0-9][a-z0-9._-]*")

    workloads = parse_workloads(check, data.get("workload"))
    model = None
    if "model" in data:
        model_text = check.scalar(data["model"], "model", "str")
        model = (path.parent / model_text).resolve()
        if not (model / "config.json").is_file():
            raise check.fail("model", f"{model_text!r} (resolved relative to the spec's folder "
                             f"to {model}) is not a model directory with a config.json")
        _check_context(check, workloads, model / "config.json")
    elif any(KINDS[w.kind].uses_model for w in workloads):
        readers = [k.name for k in KINDS.values() if k.uses_model]
        raise check.fail("model", f"required for {_listing(readers)} workloads "
                         "(a Hugging Face model directory, relative to the spec's folder)")
    engines = check.axis(data.get("engines", [DEFAULT_ENGINE]), "engines", "str",
                         choices=tuple(ENGINES))
    kinds = [w.kind for w in workloads]
    sections = {}
    for engine_name, adapter in ENGINES.items():  # the registry's order
        if engine_name in engines:
            sections[engine_name] = adapter.parse_section(
                check, data.get(adapter.section, {}), path.parent, kinds)
        elif adapter.section in data:
            raise check.fail(adapter.section, f"the spec's `engines` does not list {engine_name}")

    devices = check.axis(data.get("devices", ["local"]), "devices", "str")
    for device in devices:
        if not NAME_RE.match(device):
            raise check.fail("devices", f"{device!r} is not a device or class name")
    first = next((name for name in ENGINES if name in engines), DEFAULT_ENGINE)  # registry order
    revisions = check.axis(data.get("revisions", ENGINES[first].default_revisions()),
                           "revisions", "str")

    def number(key: str, kind: str, default: Any, low: float, high: float | None = None) -> Any:
        return check.minimum(check.scalar(data.get(key, default), key, kind), key, low, high)

    return Spec(
        path=path,
        text=text,
        hash=hashlib.sha256(text.encode()).hexdigest(),
        name=name,
        description=check.scalar(data.get("description", ""), "description", "str"),
        model=model,
        devices=devices,
        revisions=revisions,
        repeats=number("repeats", "int", 1, 1),
        warmups=number("warmups", "int", 1, 0),
        cooldown_s=number("cooldown_s", "float", 0.0, 0, MAX_PAUSE_S),
        retries=number("retries", "int", 2, 0),
        backoff_s=number("backoff_s", "float", 1.0, 0, MAX_PAUSE_S),
        order_seed=number("order_seed", "int", 0, 0),
        timeout_s=number("timeout_s", "float", 900.0, 1, MAX_TIMEOUT_S),
        workloads=workloads,
        engines=engines,
        sections=sections,
        notify=_notify(check, data.get("notify", {})),
        isa=_isa(check, data.get("isa")),
        **_track(check, data.get("track", {})),
    )


def _track(check: Checker, section: Any) -> dict[str, Any]:
    """[track]: ``confirm_budget_s``, seconds of measuring per step (at most a day), and
    ``ends_only``."""
    check.table(section, "track", {"confirm_budget_s", "ends_only"})
    budget = check.scalar(section.get("confirm_budget_s", 0.0), "track.confirm_budget_s",
                          "float")
    return {"confirm_budget_s": check.minimum(budget, "track.confirm_budget_s", 0,
                                              MAX_TIMEOUT_S),
            "ends_only": check.scalar(section.get("ends_only", False), "track.ends_only",
                                      "bool")}


def _isa(check: Checker, value: Any) -> dict[str, str]:
    """``isa``: level names (devices.isa.LEVELS), one per architecture at most -> {arch: name}."""
    pinned: dict[str, str] = {}
    for name in check.axis(value, "isa", "str") if value is not None else []:
        if name not in BY_NAME:
            raise check.fail("isa", f"{name!r} is not an instruction-set level; allowed: "
                                    f"{', '.join(BY_NAME)}")
        arch = BY_NAME[name].arch
        if arch in pinned:
            raise check.fail("isa", f"{pinned[arch]!r} and {name!r} are both {arch} levels; "
                                    "pin one per architecture")
        pinned[arch] = name
    return pinned


def _notify(check: Checker, section: Any) -> dict[str, list[str]]:
    """[notify]: http(s) URLs only. A spec is what a submitter sends: a command in it would run
    on the coordinator (notification commands are the operator's own `--notify CMD`)."""
    check.table(section, "notify", {"url", "command"})
    if "command" in section:
        raise check.fail("notify.command", "a spec may name notification URLs only (http:// "
                         "or https://); a command is the operator's own: `benchfarm serve "
                         "--notify CMD` (or `run --notify CMD` for your own run)")
    if "url" not in section:
        return {}
    urls = check.axis(section["url"], "notify.url", "str")
    for url in urls:
        try:
            checked_url(url, "url")
        except TargetRefused as exc:
            raise check.fail("notify.url", str(exc).removeprefix("url: ")) from None
    return {"url": [url.strip() for url in urls]}
