"""Ray itself: joining a cluster (code shipped by runtime_env, token errors named), placement,
and the build tasks on the driver's node.

``ray_session`` starts a local instance or joins ``--ray-address``; ``check_resources`` and
``wait_placed`` make sure every board's runner can be (and was) placed before any run starts,
so that a misdeclared resource is reported within seconds instead of hanging; ``build_on_ray``
builds an engine for every (revision, target) in parallel where the sources are.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from devices.inventory import Device
from harness import REPO_ROOT
from harness.engines import adapter_of
from harness.engines.base import BuildRecord
from harness.errors import InputError, RunFailure, sigterm_as_interrupt
from harness.execution.ray_log import keep_ray_off_the_terminal

NAMESPACE = "benchfarm"  # the board runners and artifact servers are named actors in it
# How long the board runners may take to start (on a cluster: fetching the code first).
PLACEMENT_TIMEOUT_S = float(os.environ.get("BENCHFARM_PLACEMENT_TIMEOUT_S", "120"))
# Ray refuses 127.0.0.1 as a node address (it resolves it to the public interface); any other
# loopback address keeps a local instance off the network.
LOCAL_NODE_IP = os.environ.get("BENCHFARM_RAY_NODE_IP", "127.0.0.2")
# A private instance starts Ray's dashboard only when this is set to 1.
DASHBOARD_ENV = "BENCHFARM_RAY_DASHBOARD"


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a GCS address nothing listens on (Ray itself retries for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # "auto", ray:// client addresses: left to Ray
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise RunFailure(f"--ray-address {address}: no Ray cluster answers there ({exc})"
                         ) from None


def join_failure(address: str, exc: BaseException) -> RunFailure:
    """Why joining failed, in words a user can act on: token authentication is named."""
    chain, link = [], exc
    while link is not None and len(chain) < 8:
        chain.append(link)
        link = link.__cause__ or link.__context__
    text = " ".join(f"{type(e).__name__}: {e}" for e in chain)
    if any(isinstance(e, ray.exceptions.AuthenticationError) for e in chain) or \
            "InvalidAuthToken" in text or "AuthenticationError" in text:
        return RunFailure(
            f"--ray-address {address}: the Ray cluster uses token authentication and refused "
            "this driver (no token, or a different one). Give it the cluster's token: "
            "RAY_AUTH_TOKEN=<token> (or RAY_AUTH_TOKEN_PATH=<file>, or ~/.ray/auth_token) with "
            "RAY_AUTH_MODE=token; `ray get-auth-token` on the head node prints it")
    return RunFailure(f"--ray-address {address}: cannot join the Ray cluster ({exc})")


def code_for_workers() -> dict[str, Any]:
    """The runtime_env that ships this project's packages to every node of a cluster."""
    import db
    import devices
    import harness
    import reports

    return {"py_modules": [harness, devices, db, reports], "excludes": ["__pycache__"]}


@contextmanager
def ray_session(address: str | None, resources: dict[str, float] | None = None) -> Iterator[None]:
    """Join ``address``, or start a private Ray instance declaring the inventory's resources.

    Joining a cluster ships the project's code to its nodes through ``runtime_env``: the other
    nodes need Python and the dependencies, not a checkout. Without ``address`` the instance
    is private even where a cluster runs on the machine (``ray start --head``, $RAY_ADDRESS):
    ``address="local"``, a temp dir of its own (removed at the end), Ray's random ports, and
    no dashboard unless $BENCHFARM_RAY_DASHBOARD is 1. Ray's own messages go to a log file
    named in one line (``harness.execution.ray_log``). An instance the caller already started
    (tests, notebooks) is used as it is and left running.
    """
    if ray.is_initialized():
        yield
        return
    # short: Ray's socket paths under it must stay within 108 bytes
    temp_dir = None if address else tempfile.mkdtemp(prefix="bf-ray-", dir="/tmp")
    try:
        if address:
            check_reachable(address)
        keep_ray_off_the_terminal()
        if address:
            ray.init(address=address, log_to_driver=False, runtime_env=code_for_workers(),
                     configure_logging=False)
        else:
            ray.init(address="local", _temp_dir=temp_dir, num_cpus=os.cpu_count() or 1,
                     include_dashboard=os.environ.get(DASHBOARD_ENV) == "1",
                     log_to_driver=False, _node_ip_address=LOCAL_NODE_IP,
                     configure_logging=False,
                     resources=resources or None, object_store_memory=256 * 1024 * 1024)
    except (ConnectionError, ray.exceptions.AuthenticationError) as exc:
        raise join_failure(str(address), exc) from exc
    except BaseException:
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    sigterm_as_interrupt()  # ray.init replaced the handler with an immediate exit
    try:
        yield
    finally:
        ray.shutdown()
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)


def on_driver_node() -> NodeAffinitySchedulingStrategy:
    """Placement on the driver's own node: where the sources, the builds and the model are."""
    return on_node(ray.get_runtime_context().get_node_id())


def alive_nodes() -> dict[str, str]:
    """The cluster's live nodes: node id -> IP address."""
    return {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}


def on_node(node_id: str) -> NodeAffinitySchedulingStrategy:
    """Placement on that node and no other (a task that must act on the node's own files)."""
    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def check_resources(boards: list[Device]) -> None:
    """Fail at once when some board's runner cannot be placed.

    A runner holds its board's custom resources for as long as it lives, so the boards must fit
    on the nodes together: each is given the first node with enough left (first fit).
    """
    alive = [n for n in ray.nodes() if n["Alive"]]
    names = {n["NodeID"]: n["NodeManagerAddress"] for n in alive}  # node id -> IP, for messages
    nodes = {n["NodeID"]: dict(n["Resources"]) for n in alive}
    holders: dict[str, list[str]] = {node: [] for node in nodes}
    wanting = {d.name: d for d in boards if d.resources}
    for device in wanting.values():
        fits = [node for node, free in nodes.items()
                if all(free.get(r, 0.0) >= a for r, a in device.resources.items())]
        if fits:
            for resource, amount in device.resources.items():
                nodes[fits[0]][resource] -= amount
            holders[fits[0]].append(device.name)
            continue
        want = ", ".join(f"{r!r} = {a:g}" for r, a in sorted(device.resources.items()))
        seen = "; ".join(
            f"node {names[node]} has "
            + (", ".join(f"{r!r}: {free[r]:g} left" for r in device.resources if r in free)
               or "none of them")
            + (f" (runners of {', '.join(holders[node])} placed there)" if holders[node] else "")
            for node, free in sorted(nodes.items(), key=lambda item: names[item[0]]))
        raise InputError(f"device {device.name!r}: key 'resources': no node of the Ray cluster "
                         f"can place its runner ({want}): {seen}")


def placeable(device: Device) -> bool:
    """Whether a live node of the cluster declares the board's resources (its runner could be
    placed there)."""
    return any(node["Alive"] and all(node["Resources"].get(r, 0.0) >= a
                                     for r, a in device.resources.items())
               for node in ray.nodes())


def wait_placed(boards: dict[str, Any], timeout_s: float) -> None:
    """Every runner actor started within ``timeout_s``, or a failure naming those that did not
    (their resources are held elsewhere, e.g. by another coordinator's runners)."""
    refs = {actor.__ray_ready__.remote(): name for name, actor in boards.items()}
    ready, waiting = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    try:
        ray.get(ready)
    except ray.exceptions.RayActorError as exc:
        raise RunFailure(f"a board runner failed to start: {exc}") from exc
    if waiting:
        names = ", ".join(sorted(refs[r] for r in waiting))
        raise RunFailure(f"the runners of {names} were not placed within {timeout_s:g}s: no node "
                         "has their resources free (held by other runners?) or the node could "
                         "not start them; see `ray status`")


def task_result(ref: ray.ObjectRef, failure: str) -> Any:
    """A task's result; its own error (one carrying an exit code) raised as it is, a failure of
    Ray's (the task's node died, ...) as ``failure: why``."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayError as exc:
        cause = getattr(exc, "cause", None)
        if cause is not None and hasattr(type(cause), "exit_code"):
            raise cause from None
        raise RunFailure(f"{failure}: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# Builds: one Ray task per (revision, target), on the driver's node
# ---------------------------------------------------------------------------------------------


@ray.remote(num_cpus=1)
def _build_task(engine: str, revision: str, target: str) -> BuildRecord:
    return adapter_of(engine).build(target, revision)


def build_on_ray(engine: str, targets: list[tuple[str, str]]
                 ) -> dict[tuple[str, str], BuildRecord]:
    """Build ``engine`` for every (revision, target) in parallel, on the driver's node (where
    the sources are; a task is told where the checkout is, since a cluster's workers import
    the code that runtime_env shipped)."""
    where = {"scheduling_strategy": on_driver_node(),
             "runtime_env": {"env_vars": {"BENCHFARM_REPO_ROOT": str(REPO_ROOT)}}}
    refs = {target: _build_task.options(name=f"build {target[0]} {target[1]}", **where
                                        ).remote(engine, *target)
            for target in targets}
    return {target: task_result(ref, f"building revision {target[0]} for {target[1]} failed")
            for target, ref in refs.items()}
