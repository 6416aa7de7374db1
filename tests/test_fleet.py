"""``moedispatch fleet --from 'probes/*.json'`` (issue 25 item 4): one plan per node and role from probe files, and
exit 3 when the nodes of a role disagree — another AITER release, another GPU, an environment switch exported on some
nodes only (MiniMax-M3-MXFP4 keeps 384/rank only with GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0) — naming the nodes and what
differs. Nodes that agree give one decision fingerprint and exit 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

MODEL = "MiniMax-M3-MXFP4"
ROLES = ["--role", "decode:tp=8,tokens=1-512", "--role", "prefill:tp=8,tokens=1024-16384"]


def _probe(host, product="MI355X", aiter="0.1.20.post1", env=None, gfx="gfx950"):
    return {"schema": "moedispatch.probe/1",
            "gpus": [{"index": 0, "gfx": gfx, "product": product, "compute_units": 256, "partition": None}],
            "archs": [gfx], "mixed_arch": False, "target_override": None, "sources": [],
            "aiter": {"installed": True, "version": {"value": aiter}}, "packages": {}, "notes": [],
            "node": {"host": host}, "env": env or {}}


def _write(tmp_path, *docs):
    d = tmp_path / "probes"
    d.mkdir(exist_ok=True)
    for doc in docs:
        (d / f"{doc['node']['host']}.json").write_text(json.dumps(doc))
    return str(d / "*.json")


def _fleet(cli, pattern, *extra):
    return cli("fleet", "--from", pattern, "--model", MODEL, *ROLES, *extra)


def test_equal_nodes_are_ready(cli, tmp_path):
    pattern = _write(tmp_path, _probe("n1"), _probe("n2"), _probe("n3"))
    proc = _fleet(cli, pattern)
    assert proc.returncode == 0, proc.stdout
    assert "verdict ready" in proc.stdout and "n1, n2, n3" in proc.stdout
    doc = json.loads(_fleet(cli, pattern, "--format", "json").stdout)
    assert doc["schema"] == "moedispatch.fleet/1" and not doc["problems"]
    assert all(r["agree"] for r in doc["roles"])
    fps = {r["name"]: {v["decision_fingerprint"] for v in r["nodes"].values()} for r in doc["roles"]}
    assert all(len(v) == 1 for v in fps.values()) and fps["decode"] != fps["prefill"]


def test_a_node_on_another_aiter_release_is_named(cli, tmp_path):
    proc = _fleet(cli, _write(tmp_path, _probe("n1"), _probe("n2"), _probe("n3", aiter="0.1.17")))
    assert proc.returncode == 3
    assert "role decode: node(s) n3 plan differently from n1, n2: AITER 0.1.20.post1 vs 0.1.17" in proc.stdout


def test_a_node_with_another_gpu_is_named(cli, tmp_path):
    proc = _fleet(cli, _write(tmp_path, _probe("n1"), _probe("n2"), _probe("n3", product="MI300X", gfx="gfx942")))
    assert proc.returncode == 3 and "target MI355X vs MI300X" in proc.stdout


def test_an_env_switch_on_some_nodes_only_changes_the_decode_plan(cli, tmp_path):
    """With GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0 the decode role keeps 384/rank (MXFP4 decode on FlyDSL); without it, 512
    (CK-Tile at 384 is aiter#5233): two nodes without the export pad differently from the one with it."""
    pattern = _write(tmp_path, _probe("n1"), _probe("n2"),
                     _probe("n3", env={"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "0"}))
    proc = _fleet(cli, pattern)
    assert proc.returncode == 3
    line = next(x for x in proc.stdout.splitlines() if "role decode: node(s) n3" in x)
    assert "GPTOSS_SWIGLU_MXFP4_BF16_BOUND=(unset) vs 0" in line and "6144×512 vs aiter-flydsl 6144×384" in line
    assert "role prefill: node(s)" in proc.stdout  # the env is part of what must agree everywhere


def test_roles_run_on_their_nodes(cli, tmp_path):
    pattern = _write(tmp_path, _probe("prefill-1"), _probe("decode-1"), _probe("decode-2", aiter="0.1.17"))
    proc = cli("fleet", "--from", pattern, "--model", MODEL, "--role", "decode:tp=8,tokens=1-512,nodes=decode-*",
               "--role", "prefill:tp=8,tokens=1024-16384,nodes=prefill-*")
    assert proc.returncode == 3 and "role decode: node(s) decode-2" in proc.stdout and "prefill-1 —" in proc.stdout
    proc = cli("fleet", "--from", pattern, "--model", MODEL, "--role", "decode:tp=8,tokens=1-512,nodes=nope-*")
    assert proc.returncode == 2 and "matches none of" in proc.stderr


@pytest.mark.parametrize("content, message", [
    ("not json", "cannot read a probe file"), ('{"schema": "moedispatch.lint/1"}', "not a moedispatch probe file"),
    (json.dumps({**_probe("x"), "gpus": []}), "no GPU and no MOEDISPATCH_TARGET"),
    (json.dumps({**_probe("x"), "env": {"A": 1}}), "env must map variable names to strings"),
])
def test_bad_probe_files_are_one_line(cli, tmp_path, content, message):
    (tmp_path / "bad.json").write_text(content)
    proc = cli("fleet", "--from", str(tmp_path / "*.json"), "--model", MODEL)
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1


def test_no_file_and_duplicate_nodes(cli, tmp_path):
    proc = cli("fleet", "--from", str(tmp_path / "none-*.json"), "--model", MODEL)
    assert proc.returncode == 2 and "no file matches" in proc.stderr
    (tmp_path / "a.json").write_text(json.dumps(_probe("same")))
    (tmp_path / "b.json").write_text(json.dumps(_probe("same")))
    proc = cli("fleet", "--from", str(tmp_path / "*.json"), "--model", MODEL)
    assert proc.returncode == 2 and "node same appears in two probe files" in proc.stderr


def test_real_probe_files_from_three_processes(tmp_path):
    """The probe-file path end to end: `moedispatch probe --format json` in three processes, each its own simulated
    node (MOEDISPATCH_TARGET, an AITER switch in its environment), then fleet over the files."""
    files = []
    for name, env in (("a", {}), ("b", {}), ("c", {"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "0"})):
        penv = {k: v for k, v in os.environ.items() if not k.startswith(("AITER_", "GPTOSS_", "MOEDISPATCH_"))}
        penv.update(MOEDISPATCH_TARGET="MI355X", **env)
        out = subprocess.run([sys.executable, "-m", "moedispatch.cli", "probe", "--format", "json"], env=penv,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        doc["node"]["host"] = name  # one machine plays three nodes
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        files.append(path)
    proc = subprocess.run([sys.executable, "-m", "moedispatch.cli", "fleet", "--from", str(tmp_path / "*.json"),
                           "--model", MODEL, "--role", "decode:tp=8,tokens=1-512"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "node(s) c plan differently from a, b" in proc.stdout


def test_engine_that_cannot_launch_a_nodes_plan(cli, tmp_path):
    """--engine vllm: DeepSeek-V4 (a8w4) TP8 with AITER_BF16_FP8_MOE_BOUND=0 has no safe vLLM 0.33 launch (vLLM allocates
    512 and hands FlyDSL intermediate_pad=128: aiter-pr#3538): the nodes agree, but the fleet is not ready."""
    env = {"AITER_BF16_FP8_MOE_BOUND": "0"}
    pattern = _write(tmp_path, _probe("n1", env=env), _probe("n2", env=env))
    args = ("fleet", "--from", pattern, "--model", "DeepSeek-V4-Pro", "--role", "all:tp=8,tokens=1-8192")
    assert cli(*args).returncode == 0                      # without an engine: the nodes agree
    proc = cli(*args, "--engine", "vllm")
    assert proc.returncode == 3 and "role all: node n1: vllm 0.33.0 cannot launch its plan:" in proc.stdout
    assert "aiter-pr#3538" in proc.stdout
    bad = cli(*args, "--engine", "tgi")
    assert bad.returncode == 2 and "unknown engine" in bad.stderr


def test_fleet_and_roles_json_match_their_schemas(cli, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    from pathlib import Path
    schemas = Path(__file__).resolve().parents[1] / "docs" / "schemas"
    pattern = _write(tmp_path, _probe("n1"), _probe("n2", aiter="0.1.17"))
    doc = json.loads(_fleet(cli, pattern, "--format", "json", "--engine", "vllm").stdout)
    jsonschema.validate(doc, json.loads((schemas / "fleet.schema.json").read_text()))
    roles = json.loads(cli("explain", "--model", MODEL, "--target", "MI355X", *ROLES, "--format", "json").stdout)
    jsonschema.validate(roles, json.loads((schemas / "roles.schema.json").read_text()))


# -- fleet --ray without a cluster (tests/peers/test_fleet_ray.py runs a real one) ------------------------------------

def test_fleet_ray_without_ray_is_one_line_naming_the_extra(cli, tmp_path):
    """A `ray` that cannot be imported (a stand-in package first on PYTHONPATH, whatever this venv has)."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise ImportError('simulated: no ray here')\n")
    proc = cli("fleet", "--ray", "--model", MODEL, env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "pip install 'moedispatch[ray]'" in proc.stderr


def test_ray_stays_off_explain_and_fleet_from(tmp_path):
    """Ray is imported only by `fleet --ray` (issue 25 item 5): a `ray` that explodes on import is never touched by
    explain or fleet --from."""
    from conftest import tree_python

    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise SystemExit('ray was imported')\n")
    pattern = _write(tmp_path, _probe("n1"), _probe("n2"))
    code = ("from moedispatch.cli import main\n"
            f"assert main(['explain', '--model', {MODEL!r}, '--target', 'MI355X', '--tp', '8']) == 0\n"
            f"assert main(['fleet', '--from', {pattern!r}, '--model', {MODEL!r}, '--role', 'd:tp=8,tokens=1-512']) == 0\n"
            "import moedispatch.plan.fleet_ray\n"
            "assert 'ray' not in sys.modules, 'ray imported'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOEDISPATCH_")}
    env.update(PYTHONPATH=str(tmp_path), MOEDISPATCH_AITER_VERSION="default")
    proc = subprocess.run(tree_python(code), capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


_STUB_RAY = """
import time
def init(**kwargs):          # a Ray whose GCS never answers: ray.init retries for minutes
    time.sleep(3600)
def shutdown():
    pass
"""


def test_bad_ray_arguments_are_one_line(cli, tmp_path):
    """Bad addresses, an unreachable one (TCP refused) and a silent one (ray.init never returns: a stand-in `ray`)
    are one line and exit 2 within --ray-timeout, before any task runs."""
    import socket
    import time

    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text(_STUB_RAY)
    env = {"PYTHONPATH": str(tmp_path), "RAY_ADDRESS": ""}
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        silent = f"127.0.0.1:{srv.getsockname()[1]}"
        for args, message in ((["--ray", "nonsense"], "expected HOST:PORT (port 1-65535), ray://HOST:PORT or auto"),
                              # an empty address (an unset shell variable) is not a request for auto
                              (["--ray", ""], "fleet --ray '': expected HOST:PORT"),
                              (["--ray", "127.0.0.1:99999"], "expected HOST:PORT (port 1-65535)"),
                              (["--ray", "127.0.0.1:1"], "cannot reach a Ray cluster at 127.0.0.1:1"),
                              (["--ray", "ray://127.0.0.1:1"], "cannot reach a Ray cluster at ray://127.0.0.1:1"),
                              (["--ray", "local"], "would start a new one-node cluster"),
                              (["--ray", silent, "--ray-timeout", "2"], f"no answer from the Ray cluster at {silent} "
                                                                        "within 2 s"),
                              (["--from", "x", "--ray", "auto"], "not allowed with argument"),
                              (["--from", "x", "--save-probes", str(tmp_path)], "--save-probes writes what --ray"),
                              (["--from", "x", "--data-parallel-backend", "ray"], "pass --engine vllm")):
            t0 = time.monotonic()
            proc = cli("fleet", *args, "--model", MODEL, env=env)
            assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, (args, proc.stderr)
            assert time.monotonic() - t0 < 30, args


def _answer(node_id, host, **kw):
    from moedispatch.plan.fleet_ray import NodeAnswer

    probe = kw.pop("probe", None) or _probe(host)
    return NodeAnswer(node_id, kw.pop("labels", ()), probe, **kw)


def test_ray_answers_become_the_nodes_fleet_from_reads():
    """Raylets sharing a host are told apart by node id; Ray labels select roles; a CPU-only node (no GPU, no
    MOEDISPATCH_TARGET: a typical head) is left out, said; a node whose task failed is one line naming the fix."""
    from moedispatch.core.errors import UsageError
    from moedispatch.plan.fleet import plan_fleet
    from moedispatch.plan.fleet_ray import nodes_from_answers
    from moedispatch.plan.roles import parse_role
    from moedispatch.sources.models import load_model

    answers = [_answer("b" * 56, "vm", labels=(("pool", "decode"),)), _answer("a" * 56, "vm"),
               _answer("c" * 56, "head", probe={**_probe("head"), "gpus": []})]
    pairs, skipped = nodes_from_answers(answers)
    assert [n.name for n, _ in pairs] == ["vm-aaaaaaaa", "vm-bbbbbbbb"]
    assert skipped == ["head: no GPU found and no MOEDISPATCH_TARGET set (a CPU-only node): left out"]
    assert pairs[1][1]["node"]["labels"] == {"pool": "decode"} and pairs[1][0].source == "ray:" + "b" * 12
    report = plan_fleet(load_model(MODEL), [n for n, _ in pairs], [parse_role("d:tp=8,tokens=1-512,nodes=label:decode")])
    assert list(report.roles[0].plans) == ["vm-bbbbbbbb"]
    with pytest.raises(UsageError, match=r"node dddddddd \(and 1 more\) could not be probed: ModuleNotFoundError"):
        nodes_from_answers([_answer("d" * 56, "x", failure="ModuleNotFoundError: No module named 'moedispatch'"),
                            _answer("e" * 56, "y", failure="boom")])


def test_a_node_that_plans_itself_differently_is_a_problem():
    """fleet --ray: each node also plans with its own moedispatch; a fingerprint that differs from the plan made here
    from its probe (another moedispatch or capability_db there) makes the fleet not ready."""
    from moedispatch.plan.fleet import Node, plan_fleet
    from moedispatch.plan.roles import parse_role
    from moedispatch.sources.models import load_model

    node = Node("n1", "MI355X", "0.1.20.post1", (), "ray:n1")
    report = plan_fleet(load_model(MODEL), [node], [parse_role("d:tp=8,tokens=1-512")])
    fp = report.roles[0].plans["n1"].decision_fingerprint
    report.node_plans, report.node_tools = {("d", "n1"): fp}, {"n1": "0.1.0"}
    assert report.problems() == []
    assert report.to_dict()["roles"][0]["nodes"]["n1"]["planned_on_node"] == fp
    report.node_plans = {("d", "n1"): "0" * 16}
    (line,) = report.problems()
    assert line.startswith("role d: node n1 plans itself differently (decision fingerprint 0000000000000000 on the "
                           f"node, {fp} here from its probe): it runs moedispatch 0.1.0")


def test_probe_file_labels_and_the_nodes_own_aiter_choice(cli, tmp_path):
    """The probe document as fleet --ray --save-probes writes it: node.name, node.labels (role selectors) and the
    node's MOEDISPATCH_AITER_VERSION (what its own CLI would plan for) are read by --from too."""
    docs = [_probe("x1", aiter="0.1.20.post1"), _probe("x2", aiter="0.1.20.post1",
                                                        env={"MOEDISPATCH_AITER_VERSION": "0.1.17.post1"}),
            _probe("x3")]
    for d, labels in zip(docs, ({"role": "decode"}, {"role": "decode"}, {"role": "prefill"})):
        d["node"]["labels"] = labels
    pattern = _write(tmp_path, *docs)
    proc = cli("fleet", "--from", pattern, "--model", MODEL, "--role", "decode:tp=8,tokens=1-512,nodes=label:role=decode",
               "--format", "json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 3 and list(doc["roles"][0]["nodes"]) == ["x1", "x2"]
    assert doc["problems"] == ["role decode: node(s) x2 plan differently from x1: AITER 0.1.20.post1 vs 0.1.17.post1"]
    bad = _probe("y")
    bad["node"]["labels"] = {"role": 1}
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "y.json").write_text(json.dumps(bad))
    proc = cli("fleet", "--from", str(tmp_path / "bad" / "*.json"), "--model", MODEL)
    assert proc.returncode == 2 and "node.labels must map label names to strings" in proc.stderr


def test_a_switch_vllm_ray_actors_will_not_receive_from_probe_files(cli, tmp_path):
    """--engine vllm --data-parallel-backend ray (capability_db [vllm.ray_env]): MiniMax-M3-MXFP4 TP8 decode needs
    GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0 for vLLM 0.33 to allocate what AITER runs natively; vLLM's Ray DP actors copy only
    VLLM_… variables from the launching shell, so the fleet is not ready unless the node sets it or the prefix is
    copied. Prefill needs no such switch."""
    pattern = _write(tmp_path, _probe("n1"), _probe("n2"))
    args = ("fleet", "--from", pattern, "--model", MODEL, *ROLES, "--engine", "vllm", "--data-parallel-backend", "ray")
    proc = cli(*args)
    assert proc.returncode == 3
    (line,) = [x.strip() for x in proc.stdout.splitlines() if "will not receive" in x]
    assert line.startswith("role decode: node(s) n1, n2: the vLLM recipe for its plan exports GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0")
    assert "export VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY=GPTOSS_ where vLLM is launched" in line
    assert "vllm/ray/ray_env.py" in line
    assert cli(*args, env={"VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY": "GPTOSS_"}).returncode == 0
    assert cli(*args, env={"VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "GPTOSS_SWIGLU_MXFP4_BF16_BOUND"}).returncode == 0
    assert cli(*args[:-2]).returncode == 0                       # --data-parallel-backend mp / not given: nothing
    env = {"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "0"}               # the nodes' own environment sets it: it reaches them
    pattern = _write(tmp_path, _probe("n1", env=env), _probe("n2", env=env))
    assert cli(*args).returncode == 0
    bad = cli("fleet", "--from", pattern, "--model", MODEL, "--engine", "sglang", "--data-parallel-backend", "ray")
    assert bad.returncode == 2 and "only vLLM's Ray data-parallel actors are modelled" in bad.stderr


def test_a_decode_only_bucket_issue_the_nodes_do_not_handle(cli, tmp_path):
    """DeepSeek-V4-Pro TP8 on MI355X / AITER 0.1.20.post1: the decode role (1–512) reaches ROCm/aiter#5233 (wrong
    output at 1–8 tokens) unless the node sets AITER_BF16_FP8_MOE_BOUND=0; the prefill role (1k–16k) never does."""
    def fleet(*docs):
        return cli("fleet", "--from", _write(tmp_path, *docs), "--model", "DeepSeek-V4-Pro", *ROLES)

    proc = fleet(_probe("n1"), _probe("n2"))
    assert proc.returncode == 3
    lines = [x.strip() for x in proc.stdout.splitlines() if "ROCm/aiter#5233" in x]
    assert len(lines) == 1 and lines[0].startswith("role decode: node(s) n1, n2: its token range reaches "
                                                   "ROCm/aiter#5233 at tokens 1–8")
    assert lines[0].endswith("fix: export AITER_BF16_FP8_MOE_BOUND=0 on those nodes")
    fixed = {"AITER_BF16_FP8_MOE_BOUND": "0"}
    proc = fleet(_probe("n1", env=fixed), _probe("n2", env=fixed))
    assert proc.returncode == 0 and "ROCm/aiter#5233" not in proc.stdout, proc.stdout


def test_a_node_without_aiter_is_planned_without_it(cli, tmp_path):
    """A probe with ``aiter.installed: false`` (newcomer review): the node was planned as if it had the newest AITER
    (aiter-flydsl, the same fingerprint as a 0.1.20.post1 node, "ready"); its engines will not run AITER."""
    bare = _probe("n3")
    bare["aiter"] = {"installed": False}
    proc = _fleet(cli, _write(tmp_path, _probe("n1"), _probe("n2"), bare), "--format", "json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 3 and {n["name"]: n["aiter_version"] for n in doc["nodes"]}["n3"] is None
    assert any("node(s) n3 plan differently from n1, n2: AITER 0.1.20.post1 vs none" in p for p in doc["problems"])
    moe = {name: v["moe"] for name, v in doc["roles"][0]["nodes"].items()}
    assert not any("aiter" in m for m in moe["n3"]), moe


def test_a_fleet_that_only_emulates_is_not_ready(cli, tmp_path):
    """Two equal nodes whose AITER is too old for any native MoE kernel: they agree, but the reference emulation is
    not for serving — not "ready"."""
    proc = _fleet(cli, _write(tmp_path, _probe("n1", aiter="0.1.7"), _probe("n2", aiter="0.1.7")))
    assert proc.returncode == 3, proc.stdout
    assert "only on the reference emulation" in proc.stdout


@pytest.mark.parametrize("patch, needle", [
    ({"gpus": {"a": 1}}, "gpus must be a list of objects"),
    ({"gpus": ["gfx950"]}, "gpus must be a list of objects"),
    ({"gpus": [None]}, "gpus must be a list of objects"),
    ({"gpus": [{"index": 0}]}, "gpus[0] names no gfx or product"),
    ({"aiter": [1]}, "aiter must be an object"),
    ({"aiter": {"installed": True, "version": "0.1.20"}}, "aiter.version.value is not a version string"),
    ({"aiter": {"installed": True, "version": {"value": 20}}}, "aiter.version.value is not a version string"),
])
def test_a_malformed_probe_file_is_one_line_exit_2(cli, tmp_path, patch, needle):
    """Malformed probe files (newcomer review: KeyError / AttributeError tracebacks, exit 1)."""
    proc = _fleet(cli, _write(tmp_path, {**_probe("n1"), **patch}))
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_plan_warnings_and_node_local_tuned_files_are_reported(cli, tmp_path):
    """A probe file carries the node's environment, not its files: a node whose AITER_CONFIG_FMOE names a file this
    host cannot read was 'ready' with a plan made on heuristics and no warning (newcomer review). Now it is a problem
    naming the file, and each role lists its node plans' warnings (text and JSON)."""
    odd = _probe("n3", env={"AITER_CONFIG_FMOE": "/nonexistent/x.csv"})
    pattern = _write(tmp_path, _probe("n1"), _probe("n2"), odd)
    proc = _fleet(cli, pattern)
    assert proc.returncode == 3
    assert "node n3: its AITER_CONFIG_FMOE names file(s) this host cannot read (/nonexistent/x.csv)" in proc.stdout
    assert "warning (n3): tuned set AITER_CONFIG_FMOE=/nonexistent/x.csv: AITER raises FileNotFoundError" in proc.stdout
    doc = json.loads(_fleet(cli, pattern, "--format", "json").stdout)
    found = [w for w in doc["roles"][0]["warnings"] if "FileNotFoundError" in w["message"]]
    assert found and found[0]["nodes"] == ["n3"]


# ---- inference-engineer review of `fleet` (bad input, huge fleets, engine releases) ----

def test_duplicate_and_too_many_role_names_are_one_line_as_in_explain(cli, tmp_path):
    """`explain --role` refuses two roles of one name and more than MAX_ROLES roles; fleet planned both, and the
    second role's problems and engine errors (keyed by role name) overwrote the first's."""
    pattern = _write(tmp_path, _probe("n1"))
    proc = cli("fleet", "--from", pattern, "--model", MODEL, "--role", "decode:tp=8,tokens=1-512",
               "--role", "decode:tp=8,tokens=1024-2048")
    assert proc.returncode == 2 and "--role names must differ: decode given twice" in proc.stderr, proc.stdout
    many = [a for i in range(9) for a in ("--role", f"r{i}:tp=8,tokens=1-512")]
    proc = cli("fleet", "--from", pattern, "--model", MODEL, *many)
    assert proc.returncode == 2 and "9 roles; at most 8" in proc.stderr, proc.stdout


def test_an_engine_release_newer_than_capability_db_is_said(cli, tmp_path):
    """`--engine vllm@9.9`: the recipe assumes 0.33.0's rules and says so (explain --recipe); fleet dropped that
    warning and reported 'ready' for a release nothing models."""
    pattern = _write(tmp_path, _probe("n1"), _probe("n2"))
    proc = _fleet(cli, pattern, "--engine", "vllm@9.9")
    assert "warning (all nodes): vllm 9.9 is newer than the newest release capability_db knows" in proc.stdout
    doc = json.loads(_fleet(cli, pattern, "--engine", "vllm@9.9", "--format", "json").stdout)
    assert any("vllm 9.9 is newer" in w["message"] and w["nodes"] == ["n1", "n2"] for w in doc["roles"][0]["warnings"])


@pytest.mark.parametrize("raw, needle", [
    (b"[" * 100000 + b"]" * 100000, "nests too deeply"),
    (b"{" + b" " * (17 << 20) + b"}", "too large for a probe file"),
])
def test_hostile_probe_files_are_one_line(cli, tmp_path, raw, needle):
    """A deeply nested or huge file was a RecursionError / MemoryError traceback."""
    (tmp_path / "x.json").write_bytes(raw)
    proc = cli("fleet", "--from", str(tmp_path / "*.json"), "--model", MODEL)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-400:]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_among_the_probe_files_does_not_hang(cli, tmp_path):
    """`open()` on a FIFO blocks until a writer comes: fleet hung for ever on `probes/*` holding one."""
    _write(tmp_path, _probe("n1"))
    os.mkfifo(tmp_path / "probes" / "n2.json")
    proc = cli("fleet", "--from", str(tmp_path / "probes" / "*.json"), "--model", MODEL, timeout=60)
    assert proc.returncode == 2 and "n2.json: not a regular file" in proc.stderr, proc.stderr


def test_an_over_long_aiter_version_is_one_line(cli, tmp_path):
    """A 5,000-digit release number made packaging raise ValueError (int digits limit): a traceback in fleet (from a
    probe file) and in explain (--aiter-version)."""
    long = "1" * 5000
    proc = _fleet(cli, _write(tmp_path, _probe("n1", aiter=long)))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "not a PEP 440 version" in proc.stderr
    proc = cli("explain", "--model", MODEL, "--target", "MI355X", "--aiter-version", long)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "not a PEP 440 version" in proc.stderr


@pytest.mark.parametrize("patch, needle", [
    ({"target_override": {"source": "probe:env"}}, "target_override.value is not a target name"),
    ({"target_override": 5}, "target_override.value is not a target name"),
    ({"target_override": ["MI300X"]}, "target_override.value is not a target name"),
    ({"aiter": {"installed": "no", "version": {"value": "0.1.20.post1"}}}, "aiter.installed must be true or false"),
    ({"aiter": {"installed": True, "version": {"value": "banana"}}}, "aiter.version.value 'banana' is not a PEP 440"),
    ({"node": {"host": "evil\x1b[31mred\nline"}}, "control characters"),
])
def test_malformed_probe_fields_name_the_file_exit_2(cli, tmp_path, patch, needle):
    """These were planned anyway: a target named 'None' / '5', an AITER 'no' read as installed, an error blaming an
    --aiter-version the user never passed (exit 3), a host name that wrote terminal escapes and a line break into
    the report."""
    proc = _fleet(cli, _write(tmp_path, {**_probe("n1"), **patch}) if "node" not in patch else
                  _write_as(tmp_path, "n1", {**_probe("n1"), **patch}))
    assert proc.returncode == 2 and needle in proc.stderr and "n1.json" in proc.stderr, (proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1


def _write_as(tmp_path, stem, doc):
    d = tmp_path / "probes"
    d.mkdir(exist_ok=True)
    (d / f"{stem}.json").write_text(json.dumps(doc))
    return str(d / "*.json")


def test_duplicate_node_names_name_both_files(cli, tmp_path):
    """Which two of 200 files? The line named only the host."""
    (tmp_path / "a.json").write_text(json.dumps(_probe("same")))
    (tmp_path / "b.json").write_text(json.dumps(_probe("same")))
    proc = cli("fleet", "--from", str(tmp_path / "*.json"), "--model", MODEL)
    assert proc.returncode == 2 and "a.json" in proc.stderr and "b.json" in proc.stderr, proc.stderr


def test_two_hundred_nodes_are_fast_and_readable(cli, tmp_path):
    """200 probe files, four on another AITER release: identical nodes are planned (and their recipe built) once,
    and a node list names a few nodes and counts the rest instead of 196 names per line."""
    from moedispatch.plan.fleet import load_nodes, plan_fleet
    from moedispatch.plan.roles import Role
    from moedispatch.sources.models import load_model

    docs = [_probe(f"node-{i:03d}", aiter="0.1.17" if i % 50 == 7 else "0.1.20.post1") for i in range(200)]
    pattern = _write(tmp_path, *docs)
    plans = plan_fleet(load_model(MODEL), load_nodes(pattern), [Role("all", 8, 1)]).roles[0].plans
    assert plans["node-000"] is plans["node-199"] and plans["node-007"] is plans["node-057"]
    assert plans["node-000"] is not plans["node-007"]        # another AITER release: planned on its own
    proc = _fleet(cli, pattern, "--engine", "vllm")
    assert proc.returncode == 3, proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) < 400
    assert "node-000, node-001, node-002, node-003, node-004, … and 191 more" in proc.stdout
    doc = json.loads(_fleet(cli, pattern, "--format", "json").stdout)
    assert len(doc["roles"][0]["nodes"]) == 200   # JSON keeps every node


def test_save_probes_says_what_it_replaced_and_what_else_the_folder_holds(tmp_path, capsys):
    """--save-probes wrote over files of the same name silently and left other nodes' files from an earlier run, which
    a later --from 'DIR/*.json' reads as nodes of this cluster: it says both (the warning even under -q)."""
    from types import SimpleNamespace

    from moedispatch.cli import _save_probes

    folder = tmp_path / "probes"
    folder.mkdir()
    (folder / "n1.json").write_text("{}")
    (folder / "gone.json").write_text("{}")
    said = []
    _save_probes(str(folder), [(SimpleNamespace(name="n1"), {"a": 1}), (SimpleNamespace(name="n2"), {"b": 2})],
                 said.append)
    assert said == [f"fleet: wrote 2 probe file(s) to {folder}, replacing 1"]
    err = capsys.readouterr().err
    assert "also holds 1 probe file(s) of nodes this cluster did not answer for (gone.json)" in err
    assert json.loads((folder / "n1.json").read_text()) == {"a": 1}


def test_nodes_that_cannot_be_planned_alike_share_one_line(cli, tmp_path):
    """Eight nodes on a GPU moedispatch does not know failed with eight identical lines; one line names five and
    counts the rest (the JSON keeps every node's error)."""
    pattern = _write(tmp_path, *[_probe(f"n{i}", product="MI999X", gfx="gfx999") for i in range(8)])
    proc = cli("fleet", "--from", pattern, "--model", MODEL, "--role", "all:tp=8,tokens=1-512")
    lines = [line for line in proc.stdout.splitlines() if "cannot be planned" in line]
    assert proc.returncode == 3 and len(lines) == 2, proc.stdout   # the role's line and the verdict's
    assert lines[0].strip().startswith("n0, n1, n2, n3, n4, … and 3 more: cannot be planned — ")
    assert lines[1].strip().startswith("role all: nodes n0, n1, n2, n3, n4, … and 3 more cannot be planned: ")
    doc = json.loads(cli("fleet", "--from", pattern, "--model", MODEL, "--role", "all:tp=8,tokens=1-512",
                         "--format", "json").stdout)
    assert len(doc["roles"][0]["errors"]) == 8
