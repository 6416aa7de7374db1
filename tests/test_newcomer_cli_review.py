"""Defects found by a user review (an AMD inference engineer's first hour with the CLI), each pinned by a test that
failed before its fix."""
from __future__ import annotations

import argparse
import json

import pytest

from moedispatch.aiter import lint as aiter_lint
from moedispatch.core.errors import UsageError
from moedispatch.data import aiter_configs as ac


def _folder(shared_aiter):
    return str(shared_aiter / "v0.1.12" / "aiter" / "configs")


def _lint(**kw) -> dict:
    args = argparse.Namespace(**{"aiter_env": [], "aiter_version": None, "configs": None, "format": "json",
                                 "strict": False, **kw})
    out: list[str] = []
    assert aiter_lint.run_cli(args, out.append) == 0
    return json.loads(out[0])


@pytest.mark.parametrize("junk", ["xyz", "none", "bundled"])
def test_aiter_configs_folder_refuses_a_junk_aiter_version(cli, shared_aiter, junk):
    """`aiter-configs --configs DIR --aiter-version xyz` linted DIR with the head lookup model, silently (without
    --configs the same value is exit 2): bad input is one line, exit 2, here too."""
    r = cli("aiter-configs", "--configs", _folder(shared_aiter), "--aiter-version", junk)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"moedispatch: --aiter-version {junk!r} is not a PEP 440 version, 'installed' or a release of moedispatch's "
        f"AITER index ({ac.releases()[0].tag} … {ac.releases()[-1].tag})"]


def test_aiter_configs_folder_with_installed_uses_the_installed_aiters_lookup(shared_aiter, monkeypatch):
    """`aiter-configs --configs DIR --aiter-version installed` (and the default, 'installed' when AITER is installed,
    as --help says) linted DIR with the head lookup model whatever AITER was installed: an installed 0.1.7 reads it
    with its legacy lookup, exactly as `--aiter-version 0.1.7.post2.dev18` does."""
    monkeypatch.setattr(ac, "installed_aiter", lambda: ("0.1.7.post2.dev18", "/nowhere/aiter"))
    explicit = _lint(configs=_folder(shared_aiter), aiter_version="0.1.7.post2.dev18")
    assert explicit["configs"]["dispatch"] == "legacy"
    for version in ("installed", None):
        doc = _lint(configs=_folder(shared_aiter), aiter_version=version)
        assert doc["configs"]["dispatch"] == "legacy" and doc["summary"] == explicit["summary"]
        assert "read with the installed AITER 0.1.7.post2.dev18's lookup: legacy model" in doc["configs"]["notes"][-1]


def test_aiter_configs_folder_with_installed_but_none_installed_is_bad_input(shared_aiter, monkeypatch):
    """--aiter-version installed with no AITER installed is one line (as without --configs), never the head model."""
    monkeypatch.setattr(ac, "installed_aiter", lambda: (None, None))
    with pytest.raises(UsageError, match="no AITER .* is installed"):
        _lint(configs=_folder(shared_aiter), aiter_version="installed")
    doc = _lint(configs=_folder(shared_aiter))
    assert doc["configs"]["dispatch"] == "head"  # nothing installed: the newest lookup, said
    assert "read with the newest lookup (no AITER is installed in this Python): head model" in doc["configs"]["notes"][-1]


def test_html_header_says_where_the_target_came_from_next_to_the_gpu_not_the_aiter(cli, tmp_path):
    """`explain --target MI355X --html F` with the default AITER: the page said "AITER 0.1.20.post1 (from --target)",
    crediting --target with the AITER version; the table says "256 CUs (from --target), AITER 0.1.20.post1 (default:
    …)". The provenance follows the GPU, as in the table."""
    page = tmp_path / "plan.html"
    r = cli("explain", "--model", "gpt-oss-20b", "--target", "MI355X:CPX", "--html", str(page))
    assert r.returncode == 0, r.stderr
    table_target = next(line for line in r.stdout.splitlines() if line.startswith("target  "))
    assert "32 CUs (1/8 of 256; derived) (from --target), AITER 0.1.20.post1 (default" in table_target
    assert ('<div class="meta">target gfx950 (MI355X), CPX partition, 32 CUs (from --target), AITER 0.1.20.post1 · '
            in page.read_text(encoding="utf-8"))


def test_the_page_says_what_padding_costs_in_memory_as_the_table_does(cli, tmp_path):
    """The table says "+48.0 MiB/rank per layer" and "padding adds 2.2 GiB of expert weights per rank over the whole
    model" (Qwen3-30B-A3B at TP 8: 96 → 128 per rank); the page said neither."""
    page = tmp_path / "plan.html"
    r = cli("explain", "--model", "Qwen3-30B-A3B", "--target", "MI355X", "--tp", "8", "--html", str(page))
    assert r.returncode == 0, r.stderr
    text = page.read_text(encoding="utf-8")
    assert "padding adds 2.2 GiB of expert weights per rank over the whole model" in r.stdout
    assert '<div class="meta" id="padded-bytes">padding adds 2.2 GiB of expert weights per rank over the whole model' \
        in text
    assert "zero-fill yes; +48.0 MiB/rank per layer" in text and "+48.0 MiB/rank per layer" in r.stdout


def test_static_or_dynamic_activation_scales_reach_the_json_and_the_page(cli, tmp_path):
    """The table says "activations fp8/tensor" (static scales stored in the checkpoint) or "mxfp4/group32 dynamic";
    the JSON had no such field, so the page could not say it: ``quant.activation_scales`` (an extension; absent for
    BF16 activations)."""
    cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
           "intermediate_size": 14336, "num_hidden_layers": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
           "quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}}
    folder = tmp_path / "mixtral-fp8"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    for model, want in ((str(folder), "static"), ("MiniMax-M3-MXFP4", "dynamic"), ("Mixtral-8x7B", None)):
        page = tmp_path / "plan.html"
        r = cli("explain", "--model", model, "--target", "MI300X", "--format", "json", "--html", str(page))
        assert r.returncode in (0, 3), r.stderr
        moe = next(e for e in json.loads(r.stdout)["layers"] if e["kind"] == "moe")
        assert moe["quant"].get("activation_scales") == want, (model, moe["quant"])
        quant = page.read_text(encoding="utf-8").split("<div>quant</div><div>", 1)[1].split("</div>", 1)[0]
        assert quant.endswith(f" {want}") if want else not quant.endswith(("static", "dynamic")), quant
