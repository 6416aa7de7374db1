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
