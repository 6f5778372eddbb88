"""`benchfarm audit CLAIMS.toml`: do published claims reproduce on this farm?

The claims file's experiments (spec fragments) become full specs with the model and devices
given here; every fragment is validated before anything runs. Then, for each claim that can be
compared at all, its experiment runs what is missing (stored ok runs are reused) and
``reports.audit`` gives the verdict. ``--stored-only`` runs, builds and writes nothing and judges
on what the store already holds (the matrix is still planned, without building or storing
anything, to know which stored runs are the evidence: ``harness.plan.identities``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from db.store import Store
from devices.inventory import Inventory, load_inventory
from harness import REPO_ROOT
from harness.build import build_engine
from harness.commands.run import device_list
from harness.coordinator import run_experiment
from harness.errors import InputError
from harness.plan import identities, make_plan, plan_archs, prepare
from harness.spec import WORKTREE, Spec, parse_spec
from reports.audit import (
    DeviceInfo,
    Environment,
    Verdict,
    load_claims,
    run_audit,
    terminal_table,
)
from reports.audit.report import write_audit
from reports.outdir import output_dir

DEFAULT_MODEL = REPO_ROOT / "models" / "needle-tiny"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("audit", help="audit published claims (claims/*.toml)")
    parser.add_argument("claims", help="claims file, e.g. claims/seed_000_sparse_topk.toml")
    parser.add_argument("--model", type=Path,
                        help="the model every claims experiment runs (default: the experiment's "
                             f"own `model`, else {DEFAULT_MODEL.relative_to(REPO_ROOT)})")
    parser.add_argument("--devices", type=device_list, action="extend",
                        help="device names or classes, comma-separated (default: local)")
    parser.add_argument("--inventory", help="inventory TOML (default: as for `benchfarm run`)")
    parser.add_argument("--ray-address", help="join this Ray cluster instead of starting one")
    parser.add_argument("--stored-only", action="store_true",
                        help="run nothing; judge on the runs already stored")
    parser.add_argument("--out", help="write audit.md, audit.json and audit.html here")
    parser.set_defaults(func=run)


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
    if kinds - {"attn-bench"}:  # attn-bench runs on synthetic data and needs no model
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
            config = json.loads((model / "config.json").read_text())
            names += [str(config[k]) for k in ("_name_or_path", "name") if config.get(k)]
        except (OSError, ValueError):
            pass
    devices = tuple(DeviceInfo(d.name, d.cls, d.emulated) for d in inventory.devices.values())
    return Environment(models=tuple(dict.fromkeys(names)), devices=devices)


def local_builds(targets: list[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    """Build records without Ray (after a run every build is cached, so this is quick)."""
    return {(rev, arch): build_engine(target=arch, rev=None if rev == WORKTREE else rev)
            for rev, arch in targets}


def audit_claims(claims_path: str | Path, store: Store, inventory: Inventory,
                 model: Path | None, devices: list[str], ray_address: str | None = None,
                 run_missing: bool = True) -> list[Verdict]:
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
        archs = plan_archs(spec, inventory, devices)
        if run_missing:
            summary = run_experiment(spec, inventory, store, devices, ray_address=ray_address)
            print(summary.line())
            materials = prepare(spec, archs, local_builds)  # all cached by the run
        elif spec.llama_bench is not None:
            return []  # its keys need a build: judged on the experiment's stored runs
        else:
            materials = identities(spec, archs)  # builds nothing, writes nothing
        return [r.key for r in make_plan(spec, inventory, materials, devices).runs]

    models = sorted({spec.model for spec in specs.values() if spec.model is not None}
                    or {model or DEFAULT_MODEL})
    return run_audit(claims, store, environment(models, inventory), runner)


def run(args: argparse.Namespace) -> int:
    if args.out:
        output_dir(args.out)  # refuse an unwritable --out before the audit runs anything
    inventory = load_inventory(args.inventory)
    with Store.open(args.db) as store:
        verdicts = audit_claims(args.claims, store, inventory, args.model,
                                args.devices or ["local"], args.ray_address,
                                run_missing=not args.stored_only)
    print(terminal_table(verdicts))
    if args.out:
        written = write_audit(args.out, f"audit: {Path(args.claims).name}", verdicts)
        print(f"audit: {written}")
    return 0
