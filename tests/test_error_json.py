"""Errors as JSON under ``--format json`` (issue 27): a program that reads stdout gets a ``moedispatch.error/1``
document (docs/schemas/error.schema.json) with the same one line as stderr and the exit status — never an empty stdout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")
SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "docs" / "schemas" / "error.schema.json").read_text())


@pytest.mark.parametrize("args, code", [
    (["explain", "--model", "nope", "--format", "json"], 2),
    (["explain", "--model", "GLM-5.1-MXFP4", "--tp", "x", "--format", "json"], 2),   # argparse's own error
    (["explain", "--model", "GLM-5.1-MXFP4", "--format=json", "--backend", "nope"], 2),
    (["lint", "--format", "json", "--", "ls", "-l"], 2),
    (["fleet", "--from", "/nonexistent/*.json", "--model", "GLM-5.1-MXFP4", "--format", "json"], 2),
])
def test_errors_are_json_on_stdout_and_one_line_on_stderr(cli, args, code):
    proc = cli(*args)
    assert proc.returncode == code
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["exit"] == code and doc["error"] == proc.stderr.strip() and proc.stderr.count("\n") == 1


def test_a_forced_backend_that_cannot_run_still_prints_its_plan(cli):
    """exit 3 with the plan (every rejection and why) — a document of its own, not an error document."""
    proc = cli("explain", "--model", "GLM-5.1-MXFP4", "--format", "json", "--backend", "triton")
    assert proc.returncode == 3 and json.loads(proc.stdout)["schema"] == "moedispatch.explain/1"


def test_table_errors_keep_stdout_empty(cli):
    proc = cli("explain", "--model", "nope")
    assert proc.returncode == 2 and proc.stdout == ""


def test_engine_arguments_after_dashes_do_not_count(cli):
    proc = cli("lint", "--", "vllm", "serve", "nope-model", "--format", "json")
    assert proc.returncode == 2 and proc.stdout == ""
