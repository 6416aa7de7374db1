"""``moedispatch fleet --ray [ADDRESS|auto]`` (issue 25 item 3): the nodes of a Ray cluster, probed where they run.

One small task per alive node, pinned to it (``NodeAffinitySchedulingStrategy(node_id, soft=False)``,
ray-project/ray@ray-2.60.0:python/ray/util/scheduling_strategies.py) and requesting no CPU and no GPU
(``num_cpus=0, num_gpus=0``), so it runs beside a live engine that holds every GPU. The task runs in the node's own
Python and environment: Ray starts its worker processes from the raylet, and a task without a ``runtime_env`` sees the
raylet's environment, not the driver's (ray-project/ray@ray-2.60.0:python/ray/_private/parameter.py ``env_vars``
"Override environment variables for the raylet"; runtime environments only add what they name:
https://docs.ray.io/en/latest/ray-core/handling-dependencies.html). It

* probes the node from files (:func:`moedispatch.probe.system.probe` without torch or ``import aiter``: GPUs and
  partition, CUs, the AITER release and where it came from) and records the AITER/engine environment its processes
  see (:func:`moedispatch.probe.system.node_identity`): the same ``moedispatch.probe/1`` document
  ``moedispatch probe --format json`` writes;
* plans every role there with the node's own moedispatch and capability_db (its decision fingerprints).

The driver names each node (its host; host-nodeid when several raylets share a host), adds the node's Ray labels, and
hands the documents to :func:`moedispatch.plan.fleet.node_from_probe`: from there on it is the ``--from`` code path
(same :class:`~moedispatch.plan.fleet.FleetReport`, same JSON), plus one check only Ray allows — the node's own plan
against the plan made here from its probe.

Ray is an optional extra (``pip install 'moedispatch[ray]'``) imported only by :func:`import_ray` / :func:`gather`; an unreachable
address is a one-line error within ``timeout`` seconds (``ray.init`` to a dead address retries for minutes, so the
address is tried with a plain TCP connect first and ``ray.init`` itself runs under a deadline).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, replace
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, Sequence

from moedispatch.core.errors import MoedispatchError, UsageError
from moedispatch.plan.fleet import node_from_probe, plan_fleet
from moedispatch.probe.system import node_identity, probe, report_to_dict

__all__ = ["RAY_EXTRA", "NodeAnswer", "gather", "import_ray", "nodes_from_answers", "probe_this_node"]

RAY_EXTRA = "pip install 'moedispatch[ray]'"
#: Seconds a TCP connect to the Ray address may take before the address counts as unreachable.
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class NodeAnswer:
    """What one node's task returned: its probe document, the decision fingerprint it planned for each role (or
    why it could not), the moedispatch release it runs, or why the task failed."""

    node_id: str
    labels: tuple[tuple[str, str], ...]
    probe: Any = None
    fingerprints: tuple[tuple[str, str], ...] = ()
    errors: tuple[tuple[str, str], ...] = ()
    tool: str | None = None
    failure: str | None = None


def probe_this_node(model: Any, roles: Sequence[Any]) -> dict[str, Any]:
    """The task body (runs on the node): its probe document and its own plan of every role. Never raises: a failure
    is returned as ``{"failure": "…"}`` (a Ray task error would carry a traceback)."""
    try:
        # refresh: Ray reuses worker processes, and the node's AITER may have changed since the last fleet run
        doc = report_to_dict(probe(refresh=True, allow_torch=False, try_import=False), node=node_identity())
        try:
            tool: str | None = version("moedispatch")
        except PackageNotFoundError:
            tool = None
        fingerprints: dict[str, str] = {}
        errors: dict[str, str] = {}
        try:
            node = node_from_probe(doc, "this node")
            report = plan_fleet(model, [node], [_every_node(r) for r in roles])
            for res in report.roles:
                for plan in res.plans.values():
                    fingerprints[res.role.name] = plan.decision_fingerprint
                for why in res.errors.values():
                    errors[res.role.name] = why
        except MoedispatchError as exc:
            errors["*"] = str(exc)
        return {"probe": doc, "fingerprints": fingerprints, "errors": errors, "tool": tool}
    except Exception as exc:  # noqa: BLE001 - reported per node by the driver, one line
        return {"failure": f"{type(exc).__name__}: {exc}"}


def _every_node(role: Any) -> Any:
    return replace(role, nodes="*")


def import_ray() -> Any:
    """The ``ray`` module, or a one-line UsageError naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"fleet --ray needs Ray, which this Python does not have: {RAY_EXTRA}") from None
    return ray


def _check_reachable(address: str, timeout: float) -> None:
    """A plain TCP connect to ``HOST:PORT`` (``ray://HOST:PORT``): refused or silent is a one-line UsageError."""
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"fleet --ray {address!r}: expected HOST:PORT (port 1-65535), ray://HOST:PORT or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise UsageError(f"fleet --ray: cannot reach a Ray cluster at {address} ({exc.strerror or exc}); is it "
                         "running (`ray status`)?") from None


def _auto_address(ray: Any) -> str:
    """What ``ray.init(address="auto")`` would connect to (the cluster last started on this machine), so that it can
    be tried with a plain TCP connect first; "auto" when Ray's resolver is not where 2.60 has it
    (ray-project/ray@ray-2.60.0:python/ray/_private/services.py ``canonicalize_bootstrap_address``)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:
        return "auto"
    try:
        return canonicalize_bootstrap_address("auto") or "auto"
    except ConnectionError as exc:
        raise UsageError(f"fleet --ray auto: {str(exc).splitlines()[0]}") from None
    except Exception:  # noqa: BLE001 - any other failure: let ray.init (under its deadline) say it
        return "auto"


def _connect(ray: Any, address: str, timeout: float) -> None:
    """``ray.init`` under a deadline (it retries a dead GCS for minutes): on a daemon thread, waited for."""
    box: dict[str, BaseException] = {}

    def run() -> None:
        try:
            # The driver's own logging is left alone (configure_logging=False) and the workers' output is not
            # streamed here: stdout carries only the report.
            ray.init(address=address, configure_logging=False, log_to_driver=False, ignore_reinit_error=True)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread as one line
            box["error"] = exc

    thread = threading.Thread(target=run, name="moedispatch-ray-init", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise UsageError(f"fleet --ray: no answer from the Ray cluster at {address} within {timeout:g} s")
    if "error" in box:
        first = str(box["error"]).strip().splitlines()[0] if str(box["error"]).strip() else type(box["error"]).__name__
        raise UsageError(f"fleet --ray {address}: {first}")


def gather(address: str | None, model: Any, roles: Sequence[Any], *, timeout: float = 120.0,
           progress: Callable[[str], None] | None = None) -> list[NodeAnswer]:
    """One pinned task per alive node of the Ray cluster at ``address`` (``auto``/None: ``RAY_ADDRESS`` or the
    cluster started on this machine); their answers, in node order. Bad address, no Ray, no node or a node that does
    not answer within ``timeout`` seconds: one-line UsageError."""
    say = progress or (lambda _msg: None)
    ray = import_ray()
    if address is not None and not address.strip():   # `--ray ''` (an unset shell variable): not a request for auto
        raise UsageError("fleet --ray '': expected HOST:PORT, ray://HOST:PORT or auto")
    target = (address or "auto").strip()
    if target == "auto":
        target = os.environ.get("RAY_ADDRESS") or _auto_address(ray)
    if target == "local":
        raise UsageError("fleet --ray local would start a new one-node cluster; pass the cluster's address or auto")
    if target != "auto":
        _check_reachable(target, min(CONNECT_TIMEOUT_S, timeout))
    start = time.monotonic()
    _connect(ray, target, timeout)
    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = [n for n in ray.nodes() if n.get("Alive")]
        if not alive:
            raise UsageError(f"fleet --ray {target}: the cluster has no alive node")
        say(f"fleet: connected to Ray ({len(alive)} alive node(s)); probing and planning on each …")
        task = ray.remote(num_cpus=0, num_gpus=0, max_retries=0)(probe_this_node)
        pending = {}
        for n in alive:
            ref = task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
                               name="moedispatch-fleet-probe").remote(model, list(roles))
            pending[ref] = n
        answers: dict[str, NodeAnswer] = {}
        while pending:
            left = timeout - (time.monotonic() - start)
            if left <= 0:
                late = ", ".join(_short(n) for n in pending.values())
                raise UsageError(f"fleet --ray: node(s) {late} did not answer within {timeout:g} s (busy, dead, or "
                                 "moedispatch missing there); raise --ray-timeout or check `ray status`")
            done, _ = ray.wait(list(pending), num_returns=1, timeout=min(left, 5.0))
            for ref in done:
                n = pending.pop(ref)
                answers[n["NodeID"]] = _answer(ray, ref, n)
                say(f"fleet: {len(answers)}/{len(alive)} node(s) answered ({_short(n)}, "
                    f"{time.monotonic() - start:.1f} s)")
            if not done:
                say(f"fleet: waiting for {len(pending)} node(s): {', '.join(_short(n) for n in pending.values())}")
        return [answers[n["NodeID"]] for n in alive]
    finally:
        ray.shutdown()  # disconnects this driver; the cluster keeps running


def _short(node: dict[str, Any]) -> str:
    return f"{node.get('NodeManagerHostname') or node.get('NodeManagerAddress')}/{node['NodeID'][:8]}"


def _answer(ray: Any, ref: Any, node: dict[str, Any]) -> NodeAnswer:
    labels = tuple(sorted((str(k), str(v)) for k, v in (node.get("Labels") or {}).items()
                          if not str(k).startswith("ray.io/")))
    try:
        got = ray.get(ref)
    except Exception as exc:  # noqa: BLE001 - a task that failed before our code ran (unpickling: no moedispatch)
        text = str(exc).strip().splitlines()
        last = next((line for line in reversed(text) if line.strip()), type(exc).__name__)
        return NodeAnswer(node["NodeID"], labels, failure=last.strip())
    if "failure" in got:
        return NodeAnswer(node["NodeID"], labels, failure=got["failure"])
    return NodeAnswer(node["NodeID"], labels, got["probe"], tuple(sorted(got["fingerprints"].items())),
                      tuple(sorted(got["errors"].items())), got.get("tool"))


def nodes_from_answers(answers: Sequence[NodeAnswer]) -> tuple[list[tuple[Any, dict[str, Any]]], list[str]]:
    """(:class:`~moedispatch.plan.fleet.Node`, the probe document as ``--save-probes`` writes it) per answer, and the
    nodes left out (no GPU and no MOEDISPATCH_TARGET: a CPU-only head node). Nodes are named by host, host-NODEID when
    several raylets share a host; a node whose task failed is a one-line UsageError."""
    failed = [a for a in answers if a.failure is not None]
    if failed:
        a = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise UsageError(f"fleet --ray: node {a.node_id[:8]}{more} could not be probed: {a.failure} — install "
                         "moedispatch in every node's Python (the one its raylet runs)")
    hosts = [str((a.probe.get("node") or {}).get("host") or a.node_id[:8]) for a in answers]
    out, skipped = [], []
    for a, host in zip(answers, hosts):
        name = host if hosts.count(host) == 1 else f"{host}-{a.node_id[:8]}"
        doc = dict(a.probe)
        doc["node"] = {**(doc.get("node") or {}), "name": name, "labels": dict(a.labels), "ray_node_id": a.node_id,
                       **({"moedispatch": a.tool} if a.tool else {})}
        if not doc.get("gpus") and not doc.get("target_override"):
            skipped.append(f"{name}: no GPU found and no MOEDISPATCH_TARGET set (a CPU-only node): left out")
            continue
        out.append((node_from_probe(doc, f"ray:{a.node_id[:12]}"), doc))
    if not out:
        raise UsageError("fleet --ray: no node of the cluster has a GPU or MOEDISPATCH_TARGET: " + "; ".join(skipped))
    out.sort(key=lambda pair: pair[0].name)  # the order --from reads the saved files in (sorted names)
    return out, skipped
