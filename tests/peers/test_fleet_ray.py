"""``moedispatch fleet --ray`` against a REAL local Ray cluster (issue 25 items 3 and 6).

``ray.cluster_utils.Cluster`` starts three raylets on this machine, each with its own environment and labels
(ray-project/ray@ray-2.60.0:python/ray/cluster_utils.py ``Cluster.add_node(**node_args)`` → ``RayParams(env_vars=…,
labels=…)``; parameter.py: ``env_vars`` "Override environment variables for the raylet"). Ray starts a node's
workers from its raylet, so each node's task sees that node's environment — what the probe honours:
``MOEDISPATCH_TARGET`` (the GPU; moedispatch/probe/system.py) and ``MOEDISPATCH_AITER_VERSION`` (the AITER release the
node's CLI plans for; moedispatch/probe/targets.py ``cli_aiter_version``). Three simulated nodes:

====  ===============================  ==============  ======
node  labels                           GPU             AITER
====  ===============================  ==============  ======
1     moedispatch-role=prefill, pool=a MI355X          0.1.20.post1
2     moedispatch-role=decode,  pool=a MI355X          0.1.20.post1
3     moedispatch-role=decode,  pool=b MI355X          0.1.17.post1 (the drift)
====  ===============================  ==============  ======

Runs only in an interpreter that has Ray (``moedispatch[ray]``): ``.peers-venv/bin/python -m pytest -q
tests/peers/test_fleet_ray.py`` (``tests/peers/setup_env.sh`` installs ``ray==2.60.*`` there); the README's test command
(.venv, no Ray) skips it. The cluster is started once for the module (~7-12 s on the 2-core VM) in a keeper process and
shut down after; each fleet run is a fresh CLI process (~3-7 s); the module takes ~33 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import peers

MODEL = "MiniMax-M3-MXFP4"
DECODE = "decode:tp=8,tokens=1-512"
PREFILL = "prefill:tp=8,tokens=1024-16384"
NODES = [
    {"labels": {"moedispatch-role": "prefill", "pool": "a"},
     "env": {"MOEDISPATCH_TARGET": "MI355X", "MOEDISPATCH_AITER_VERSION": "0.1.20.post1"}},
    {"labels": {"moedispatch-role": "decode", "pool": "a"},
     "env": {"MOEDISPATCH_TARGET": "MI355X", "MOEDISPATCH_AITER_VERSION": "0.1.20.post1"}},
    {"labels": {"moedispatch-role": "decode", "pool": "b"},
     "env": {"MOEDISPATCH_TARGET": "MI355X", "MOEDISPATCH_AITER_VERSION": "0.1.17.post1"}},
]

_KEEPER = r"""
import json, sys, time
t0 = time.time()
from ray.cluster_utils import Cluster
c = Cluster()
for spec in json.loads(sys.argv[1]):
    c.add_node(num_cpus=1, object_store_memory=80 * 1024 * 1024, labels=spec["labels"], env_vars=spec["env"],
               **({"include_dashboard": False} if c.head_node is None else {}))
c.wait_for_nodes()
print("@@" + json.dumps({"address": c.address, "up_s": round(time.time() - t0, 1)}), flush=True)
sys.stdin.read()   # until the test module closes stdin
c.shutdown()
"""


def _ray_python() -> str | None:
    """This interpreter when it can import ray (and moedispatch): the cluster and every fleet run use it."""
    ok = subprocess.run([sys.executable, "-c", "import ray, moedispatch"], capture_output=True, timeout=120)
    return sys.executable if ok.returncode == 0 else None


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MOEDISPATCH_", "AITER_", "GPTOSS_", "VLLM_", "RAY_"))}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def cluster():
    python = _ray_python()
    if python is None:
        pytest.skip("Ray is not installed in this Python (pip install 'moedispatch[ray]'); run "
                    "tests/peers/setup_env.sh, then .peers-venv/bin/python -m pytest tests/peers/test_fleet_ray.py")
    t0 = time.monotonic()
    keeper = subprocess.Popen([python, "-c", _KEEPER, json.dumps(NODES)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_clean_env(),
                              cwd=str(peers.ROOT))
    try:
        line = keeper.stdout.readline()
        if not line.startswith("@@"):
            keeper.kill()
            pytest.fail(f"the Ray cluster did not start: {line}{keeper.stderr.read()[-3000:]}")
        info = json.loads(line[2:])
        info.update(python=python, started_s=round(time.monotonic() - t0, 1))
        yield info
    finally:
        if keeper.poll() is None:
            keeper.stdin.close()
            try:
                keeper.wait(timeout=60)
            except subprocess.TimeoutExpired:
                keeper.kill()
                keeper.wait()


def _fleet(cluster, *args, env=None, timeout=180, model=MODEL):
    cmd = [cluster["python"], "-m", "moedispatch.cli", "fleet", "--ray", cluster["address"], "--model", model, *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(**(env or {})), timeout=timeout,
                          cwd=str(peers.ROOT))
    proc.wall_s = time.monotonic() - t0
    return proc


def _names(doc):
    """label pool/role → node names, from the report's own node list (Ray names raylets that share a host by id)."""
    return {(n["labels"]["moedispatch-role"], n["labels"]["pool"]): n["name"] for n in doc["nodes"]}


def test_aiter_drift_on_one_node_is_named(cluster, tmp_path):
    """Done-when: one node on another AITER release → exit 3 naming that node and what differs; the prefill role
    (one node) agrees; every node planned itself exactly as the driver plans it from its probe; progress on stderr."""
    roles = ["--role", DECODE, "--role", PREFILL + ",nodes=label:prefill"]   # decode on every node: 2 agree, 1 not
    proc = _fleet(cluster, *roles, "--format", "json", "--save-probes", str(tmp_path / "probes"))
    assert proc.returncode == 3, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    names = _names(doc)
    drift, good = names[("decode", "b")], sorted([names[("decode", "a")], names[("prefill", "a")]])
    (line,) = [p for p in doc["problems"] if p.startswith("role decode")]
    assert line == (f"role decode: node(s) {drift} plan differently from {', '.join(good)}: AITER 0.1.20.post1 vs "
                    "0.1.17.post1")
    assert {r["name"]: r["agree"] for r in doc["roles"]} == {"decode": False, "prefill": True}
    assert all(n["source"].startswith("ray:") and n["moedispatch"] for n in doc["nodes"])
    for role in doc["roles"]:
        for entry in role["nodes"].values():
            assert entry["planned_on_node"] == entry["decision_fingerprint"]
    assert "3/3 node(s) answered" in proc.stderr and "connected to Ray (3 alive node(s))" in proc.stderr

    # The same report from the probe documents it gathered (`--from`: one code path after the nodes are collected).
    replay = subprocess.run([cluster["python"], "-m", "moedispatch.cli", "fleet", "--from",
                             str(tmp_path / "probes" / "*.json"), "--model", MODEL, *roles, "--format", "json"],
                            capture_output=True, text=True, env=_clean_env(), timeout=180)
    assert replay.returncode == 3, replay.stderr
    offline = json.loads(replay.stdout)

    def strip(d):
        d = json.loads(json.dumps(d))
        for n in d["nodes"]:
            n.pop("source"), n.pop("moedispatch", None)
        for r in d["roles"]:
            for e in r["nodes"].values():
                e.pop("planned_on_node", None)
        return d

    a, b = strip(offline), strip(doc)
    assert a["nodes"] == b["nodes"]
    assert a == b


def test_equal_nodes_are_ready(cluster):
    """Done-when: with all nodes of each role equal, exit 0; the two roles plan differently (decode pads 384→512,
    CK-Tile decodes at 384: ROCm/aiter#5233; prefill runs 384), each with one fingerprint over its two nodes."""
    roles = ["--role", DECODE + ",nodes=label:pool=a", "--role", PREFILL + ",nodes=label:pool=a"]
    proc = _fleet(cluster, *roles)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "verdict ready" in proc.stdout and "from Ray cluster at" in proc.stdout
    doc = json.loads(_fleet(cluster, *roles, "--format", "json").stdout)
    assert not doc["problems"]
    fps = {r["name"]: {e["decision_fingerprint"] for e in r["nodes"].values()} for r in doc["roles"]}
    moe = {r["name"]: {tuple(e["moe"]) for e in r["nodes"].values()} for r in doc["roles"]}
    assert all(len(r["nodes"]) == 2 for r in doc["roles"])
    assert len(fps["decode"]) == len(fps["prefill"]) == 1 and fps["decode"] != fps["prefill"]
    assert moe == {"decode": {("aiter-flydsl 6144×512",)}, "prefill": {("aiter-flydsl 6144×384",)}}


def test_a_switch_vllm_ray_actors_will_not_receive(cluster):
    """MiniMax-M3-MXFP4 TP8: vLLM 0.33 allocates what AITER runs natively in decode only with
    GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0, which vLLM's Ray data-parallel actors do not copy from the launching shell
    (vllm-project/vllm@v0.33.0:vllm/ray/ray_env.py get_env_vars_to_copy): exit 3 with the fix for the decode role;
    the prefix copied → exit 0."""
    args = ["--role", DECODE + ",nodes=label:pool=a", "--role", PREFILL + ",nodes=label:pool=a",
            "--engine", "vllm", "--data-parallel-backend", "ray"]
    proc = _fleet(cluster, *args)
    assert proc.returncode == 3, proc.stdout + proc.stderr[-2000:]
    (line,) = [x.strip() for x in proc.stdout.splitlines() if "will not receive" in x]
    assert line.startswith("role decode: node(s) ") and "GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0" in line
    assert "fix: export VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY=GPTOSS_ where vLLM is launched" in line
    fixed = _fleet(cluster, *args, env={"VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY": "GPTOSS_"})
    assert fixed.returncode == 0, fixed.stdout


def test_a_decode_only_bucket_issue_is_named(cluster):
    """Planted fault: DeepSeek-V4-Pro TP8 on the two equal nodes (MI355X, AITER 0.1.20.post1) — the decode role's
    token range reaches ROCm/aiter#5233 (wrong output at 1–8 tokens), which no node's environment handles; the
    prefill role never reaches it: exit 3 naming the decode role, its nodes and the export that fixes it."""
    roles = ["--role", DECODE + ",nodes=label:pool=a", "--role", PREFILL + ",nodes=label:pool=a"]
    proc = _fleet(cluster, *roles, "--format", "json", model="DeepSeek-V4-Pro")
    assert proc.returncode == 3, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    (line,) = [p for p in doc["problems"] if "ROCm/aiter#5233" in p]
    assert line.startswith("role decode: node(s) ") and "reaches ROCm/aiter#5233 at tokens 1–8" in line
    assert line.endswith("fix: export AITER_BF16_FP8_MOE_BOUND=0 on those nodes")


def test_an_unreachable_address_is_one_line_fast(cluster):
    t0 = time.monotonic()
    proc = subprocess.run([cluster["python"], "-m", "moedispatch.cli", "fleet", "--ray", "127.0.0.1:1", "--model",
                           MODEL], capture_output=True, text=True, env=_clean_env(), timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "cannot reach a Ray cluster" in proc.stderr
    assert time.monotonic() - t0 < 30


def test_a_silent_address_gives_up_within_the_timeout(cluster):
    """A port that accepts but never speaks Ray: ray.init would retry for minutes; fleet gives up at --ray-timeout."""
    import socket

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        t0 = time.monotonic()
        proc = subprocess.run([cluster["python"], "-m", "moedispatch.cli", "fleet", "--ray",
                               f"127.0.0.1:{srv.getsockname()[1]}", "--ray-timeout", "4", "--model", MODEL],
                              capture_output=True, text=True, env=_clean_env(), timeout=60)
    assert proc.returncode == 2 and "no answer from the Ray cluster" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert time.monotonic() - t0 < 20
