"""The harness's side of `benchfarm audit`: claims experiments become specs and run.

A claims file's experiments (spec fragments) become full specs with the model and devices given
here; every fragment is validated before anything runs. Then, for each claim that can be
compared at all, its experiment runs what is missing (stored ok runs are reused) and
``reports.audit`` gives the verdict. Without running (``--stored-only``, ``report --claims``)
nothing is built or written: the matrix is still planned, from the builds' identities, to know
which stored runs are the evidence (``harness.plan.planner.identities``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from db.measurements import Selection
from db.store import Store
from devices.files import read_json
from devices.inventory import Inventory
from harness import DEFAULT_MODEL
from harness.access.caller import Caller
from harness.engines import adapter_of
from harness.engines.base import BuildRecord, NeedsBuild
from harness.errors import InputError
from harness.execution.coordinator import RunRequest, run_experiment
from harness.plan.matrix import resolve_placements
from harness.plan.planner import identities, make_plan, prepare
from harness.spec import Spec, parse_spec
from harness.verify.engine_checks import EngineChecks
from harness.workloads.kinds import KINDS
from reports.audit import DeviceInfo, Environment, Verdict, load_claims, run_audit
from reports.audit.checks import ENGINE_METRICS


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise InputError(f"cannot write {value!r} into a spec")


def toml_table(prefix: str, table: dict[str, Any]) -> list[str]:
    """TOML lines of a nested table: its scalars, then sub-tables and arrays of tables."""
    lines = [f"{key} = {toml_value(value)}" for key, value in table.items()
             if not isinstance(value, dict) and not _is_table_array(value)]
    for key, value in table.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            lines += ["", f"[{name}]", *toml_table(name, value)]
        elif _is_table_array(value):
            for item in value:
                lines += ["", f"[[{name}]]", *toml_table(name, item)]
    return lines


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def compose_spec(name: str, fragment: dict[str, Any], model: Path | None, devices: list[str],
                 claims_path: Path) -> Spec:
    """A full spec from a claims file's experiment fragment; errors name the claims file.

    The model is ``model`` when given, else the fragment's own ``model`` (relative to the claims
    file), else the shipped needle model."""
    table: dict[str, Any] = {"name": name, "devices": devices}
    kinds = {w.get("kind") for w in fragment.get("workload", []) if isinstance(w, dict)}
    # a kind of synthetic data (attn-bench) needs no model; an unknown one is refused later
    if any(kind not in KINDS or KINDS[kind].uses_model for kind in kinds):
        table["model"] = str((model or DEFAULT_MODEL).resolve())
    table.update({k: v for k, v in fragment.items() if k != "model" or model is None})
    text = "\n".join(toml_table("", table)) + "\n"
    where = claims_path.parent / f"{claims_path.name}#experiment.{name}"
    return parse_spec(text, where)


def environment(models: list[Path], inventory: Inventory) -> Environment:
    names = []
    for model in models:
        names.append(model.resolve().name)
        try:
            config = read_json(model / "config.json")
            names += [str(config[k]) for k in ("_name_or_path", "name")  # type: ignore[union-attr]
                      if config.get(k)]  # type: ignore[union-attr]
        except (OSError, ValueError, AttributeError):
            pass
    devices = tuple(DeviceInfo(d.name, d.cls, d.emulated) for d in inventory.devices.values())
    return Environment(models=tuple(dict.fromkeys(names)), devices=devices)


def local_builds(engine: str, targets: list[tuple[str, str]]
                 ) -> dict[tuple[str, str], BuildRecord]:
    """Build records without Ray (after a run every build is cached, so this is quick)."""
    return {(rev, arch): adapter_of(engine).build(arch, rev) for rev, arch in targets}


def audit_claims(claims_path: str | Path, store: Store, inventory: Inventory,
                 model: Path | None, devices: list[str], ray_address: str | None = None,
                 run_missing: bool = True, progress: TextIO | None = None,
                 selection: Selection | None = None,
                 caller: Caller | None = None) -> list[Verdict]:
    """Audit one claims file: validate its experiments, run what is missing, judge each claim.

    The entry point for other commands too (e.g. a demo that ends with the audit's section:
    ``reports.audit.audit_section(title, verdicts)`` into ``render_report``).
    """
    claims = load_claims(claims_path)
    specs = {name: compose_spec(name, fragment, model, devices, claims.path)
             for name, fragment in claims.experiments.items()}  # validate all before running

    def runner(name: str, _fragment: dict[str, Any]) -> list[str]:
        """Run what is missing (unless stored-only); the run keys of the whole matrix.

        Keys, not the experiment's name, find the evidence: a run belongs to the experiment
        that first stored it, which may be another one (run keys are global)."""
        spec = specs[name]
        placements = resolve_placements(spec, list(inventory.devices.values()), devices)
        if run_missing:
            summary = run_experiment(RunRequest(spec, inventory, devices,
                                                ray_address=ray_address, caller=caller), store)
            print(summary.line(), file=progress or sys.stdout)
            prepared = prepare(spec, placements, local_builds)  # all cached by the run
        else:
            try:
                prepared = identities(spec, placements)  # builds nothing, writes nothing
            except NeedsBuild:
                return []  # its keys need a build: judged on the experiment's stored runs
        return [r.key for r in make_plan(spec, placements, inventory.devices, prepared).runs]

    models = sorted({spec.model for spec in specs.values() if spec.model is not None}
                    or {model or DEFAULT_MODEL})
    # checks that run lmc here directly (the attention-reference article's); never without running
    engine_checks = None
    if run_missing and any(c.metric in ENGINE_METRICS for c in claims.claims):
        engine_checks = EngineChecks(model or DEFAULT_MODEL).checks()
    return run_audit(claims, store, environment(models, inventory), runner, engine_checks,
                     selection)
