"""The second newcomer report's remaining minor findings (issue 27; ``../shared/reference/round3/newcomer.md``
"Minor"), each with the report's command. Minor 14 (probe and HIP_VISIBLE_DEVICES) is in test_probe.py, next to the
probe's other env tests.

The CLI runs in-process (``moedispatch.cli.main``, test_newcomer_input.run).
"""

from __future__ import annotations

import json

from test_newcomer_input import one_line_error, run

# -- 19. lint's JSON says what launch it parsed -------------------------------------------------------------------

SCRIPT = """\
export VLLM_ROCM_USE_AITER=1
TP=${TP:-8}
vllm serve amd/MiniMax-M3-MXFP4 \\
    --tensor-parallel=$TP --max-num-batched-tokens 4096 --trust-remote-code
"""


def test_lint_json_says_what_it_parsed_from_a_script(monkeypatch, tmp_path):
    """Minor 19: the lint JSON had no `args` or `command` field; a user could not see which line lint read nor how."""
    script = tmp_path / "serve.sh"
    script.write_text(SCRIPT)
    code, out, err = run(["lint", str(script), "--target", "MI355X", "--format", "json"], monkeypatch)
    assert code in (0, 3), err
    launch = json.loads(out)["launch"]
    assert launch == {"from": str(script),
                      "argv": ["vllm", "serve", "amd/MiniMax-M3-MXFP4", "--tensor-parallel=8",
                               "--max-num-batched-tokens", "4096", "--trust-remote-code"],
                      "model": "amd/MiniMax-M3-MXFP4",
                      # the abbreviation resolved to vLLM's own dest; an option lint does not read is not listed
                      "options": {"max_num_batched_tokens": "4096", "tensor_parallel_size": "8"}}


def test_lint_json_says_what_it_parsed_from_arguments_and_stdin(monkeypatch):
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "amd/MiniMax-M3-MXFP4", "--tp", "8",
            "--expert-parallel-size", "8", "--enable-dp-attention"]
    code, out, err = run(["lint", "--target", "MI355X", "--format", "json", "--", *argv], monkeypatch)
    launch = json.loads(out)["launch"]
    assert launch["from"] == "arguments" and launch["argv"] == argv
    assert launch["options"] == {"enable_dp_attention": True, "ep_size": "8", "tp_size": "8"}
    code, out, err = run(["lint", "-", "--target", "MI355X", "--format", "json"], monkeypatch, stdin=SCRIPT)
    assert json.loads(out)["launch"]["from"] == "stdin"


# -- 30. `-q` is offered by --help as "log warnings only", which is the default -----------------------------------

def test_quiet_help_says_what_it_does_beyond_the_default(cli):
    """Minor 30: `--help` offered `-q, --quiet  log warnings only`, which is what every run does without -v. -q
    stays (scripts pass it; it silences verify's and fleet's progress lines and wins over -v): the help says so."""
    proc = cli("--help")
    help_text = " ".join(proc.stdout.split())
    assert proc.returncode == 0 and "log warnings only" not in help_text
    assert "-q, --quiet no progress lines on stderr (verify, fleet --ray) and no -v logging" in help_text


def test_quiet_wins_over_verbose(monkeypatch):
    argv = ["explain", "--model", "Mixtral-8x7B", "--target", "MI300X", "--brief", "--log-format", "json"]
    assert "backend_selected" in run(["-v", *argv], monkeypatch)[2]
    code, out, err = run(["-v", "-q", *argv], monkeypatch)
    assert code == 0 and "backend_selected" not in err


# -- 3. an emulation answer names what would run natively ----------------------------------------------------------

def test_what_if_names_a_native_alternative_for_an_emulation_group(monkeypatch):
    """Minor 3: MiniMax-M3-MXFP4 on MI300X is emulation (gfx942 has no MX/FP4 MFMA); --what-if printed nothing for the
    group, although MI355X runs this checkpoint natively and an FP8 checkpoint runs natively on MI300X."""
    argv = ["explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI300X", "--what-if"]
    code, out, err = run([*argv, "--format", "json"], monkeypatch)
    assert code == 0, err
    doc = json.loads(out)
    (group,) = [g for g in doc["groups"] if g["backend"] == "emulation"]
    texts = group["what_if"]
    assert texts[0].startswith("what-if: this checkpoint on gfx950 (MI355X) with AITER ")
    assert ": aiter-flydsl, " in texts[0] and "on emulation at 8192 tokens (-" in texts[0]
    assert texts[1].startswith("what-if: an FP8 checkpoint (128×128 weight blocks) of MiniMax-M3-MXFP4 on gfx942 "
                               "(MI300X) (other weights: check its accuracy): triton, ")
    table = run(argv, monkeypatch)[1]
    assert "what-if this checkpoint on gfx950 (MI355X)" in table and "what-if an FP8 checkpoint" in table
    # a group that runs natively gets no such line
    native = json.loads(run(["explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--what-if",
                             "--format", "json"], monkeypatch)[1])
    assert not any("this checkpoint on" in t for g in native["groups"] for t in g.get("what_if", []))


# -- 6 (the rest). doubled labels: `warning caveat [scale tiles]`, `(derived) (derived)` ---------------------------

#: The published Qwen3-Coder-480B-A35B-Instruct-FP8 config.json (block-128 FP8, moe_intermediate_size 2560), as the
#: report built it; TP8 splits its 128×128 scale tiles.
QWEN_CODER_FP8 = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 6144,
                  "intermediate_size": 8192, "moe_intermediate_size": 2560, "num_experts": 160,
                  "num_experts_per_tok": 8, "num_hidden_layers": 62, "num_attention_heads": 96,
                  "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu", "decoder_sparse_step": 1,
                  "mlp_only_layers": [], "norm_topk_prob": True, "torch_dtype": "bfloat16", "vocab_size": 151936,
                  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                          "weight_block_size": [128, 128]}}


def test_a_caveat_raised_to_a_warning_is_labelled_once(monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN_CODER_FP8))
    argv = ["explain", "--model", str(tmp_path), "--target", "MI300X", "--tp", "8"]
    code, out, err = run(argv, monkeypatch)
    assert code == 0, err
    assert "warning caveat" not in out and "warning [scale tiles]: the TP shard 320" in out
    assert "warning [aiter#4783] gfx942 FP8" in out
    recipe = run([*argv, "--recipe", "vllm"], monkeypatch)[1]
    assert "# WARNING: caveat" not in recipe and "# WARNING: [scale tiles]: the TP shard 320" in recipe


def test_a_confidence_marker_is_printed_once(monkeypatch):
    code, out, err = run(["explain", "--model", "Qwen3-235B-A22B-Instruct-2507", "--aiter-version", "0.1.10.post2",
                          "--target", "MI355X", "--tp", "8"], monkeypatch)
    assert code == 0, err
    assert "(derived) (derived)" not in out and "the heuristic fallbacks are modelled on HEAD e4048607 (derived)" in out
    compare = run(["compare", "--model", "Qwen3-235B-A22B-Instruct-2507", "--aiter-version", "0.1.10.post2,0.1.20.post1",
                   "--target", "MI355X", "--tp", "8"], monkeypatch)[1]
    assert "(derived) (derived)" not in compare


def test_with_marker():
    from moedispatch.core.reason import Reason, with_marker

    assert with_marker("x (derived)", "derived", " [2]") == "x [2] (derived)"
    assert with_marker("x", "unconfirmed") == "x (unconfirmed)"
    assert with_marker("x (derived)", "confirmed") == "x (derived)"  # a confirmed text is never changed
    assert Reason("y (derived)", "note", "src", confidence="derived").marked() == "y (src) (derived)"


# -- 7. internal jargon -------------------------------------------------------------------------------------------

def test_engine_finding_does_not_name_a_source_file_of_moedispatch(monkeypatch, tmp_path):
    """Minor 7: `--engine vllm` on Qwen3-Coder said "rules.py's 'vLLM refuses this shape' caveat"; it names the
    caveat the user sees instead. (The target line's one provenance notation: test_output.py.)"""
    (tmp_path / "config.json").write_text(json.dumps(QWEN_CODER_FP8))
    code, out, err = run(["explain", "--model", str(tmp_path), "--target", "MI300X", "--tp", "8", "--engine", "vllm",
                          "--engine-env", "VLLM_ROCM_USE_AITER=1"], monkeypatch)
    assert code == 0, err
    assert "rules.py" not in out and "pass caps=" not in out + err
    assert "moedispatch's [scale tiles] caveat (vLLM refuses this shape) holds only where gcd(128, I/rank" in out


# -- 22. --engine models only the newest releases; --help and the error say so -------------------------------------

def test_engine_release_range_is_said(cli, monkeypatch):
    """Minor 22: `--engine vllm@0.25.0` → "no model of vllm 0.25.0" while --recipe covers vLLM from 0.23, and
    `explain --help` did not say --engine models only vllm 0.33.0 / sglang 0.5.23."""
    line = one_line_error(*run(["explain", "--model", "Mixtral-8x7B", "--engine", "vllm@0.25.0"], monkeypatch))
    assert line.startswith("moedispatch: no model of vllm 0.25.0: capability_db/engines knows vllm 0.33.0")
    assert "--recipe vllm --engine-version 0.25.0; recipes cover vllm 0.23.0 … 0.33.0" in line
    help_text = " ".join(cli("explain", "--help").stdout.split())
    assert "Modelled for the newest release of each engine only (vllm 0.33.0, sglang 0.5.23)" in help_text
    from moedispatch.data import capdb

    data = capdb.load_toml("engines.toml")  # the help's hard-coded releases follow the data
    for engine in ("vllm", "sglang"):
        assert f"{engine} {data[engine]['newest']}" in help_text
        assert f"{engine} from {data[engine]['releases'][0]}" in help_text


# -- 25. --target gfx942 names an arch of four products ------------------------------------------------------------

def test_an_arch_target_says_which_product_it_assumed(monkeypatch):
    """Minor 25: `--target gfx942` was silently MI300X (304 CUs); gfx942 is also MI308X (80 CUs), whose AITER tuned
    rows differ (cu_num 80). A product name, or an arch whose products share a CU count, gets no such warning."""
    doc = json.loads(run(["explain", "--model", "Mixtral-8x7B", "--target", "gfx942", "--format", "json"],
                         monkeypatch)[1])
    (note,) = [w for w in doc["warnings"] if "names an arch" in w]
    assert note.startswith("target gfx942 names an arch, not a product: planned for MI300X (304 CUs), the arch's "
                           "first product; gfx942 is also MI325X (304 CUs), MI300A (228 CUs), MI308X (80 CUs)")
    for target in ("MI300X", "MI308X", "MI300X:CPX"):
        doc = json.loads(run(["explain", "--model", "Mixtral-8x7B", "--target", target, "--format", "json"],
                             monkeypatch)[1])
        assert not any("names an arch" in w for w in doc["warnings"])


def test_packaging_metadata_minor_31():
    """Newcomer minor 31: a LICENSE file, the license as an SPDX expression (PEP 639, not the deprecated table) and
    no AITER in the rocm extra (a PyPI amd-aiter could replace a ROCm image's source-built AITER)."""
    import sys
    from pathlib import Path

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert "Apache License" in (root / "LICENSE").read_text()
    assert not any("aiter" in dep for dep in project["optional-dependencies"]["rocm"])


# -- 23. aliases: suggested, said when used, listed ---------------------------------------------------------------------

def test_aliases_are_suggested_said_and_listed(monkeypatch):
    """Minor 23: 'DeepSeek-R1-0528' was offered 'DeepSeek-V4-Pro'; the declared alias deepseek-ai/DeepSeek-R1 resolved
    to DeepSeek-V3 silently; `models` showed neither HF ids nor aliases."""
    line = one_line_error(*run(["explain", "--model", "DeepSeek-R1-0528", "--target", "MI355X"], monkeypatch))
    assert "(did you mean 'DeepSeek-R1', an alias of DeepSeek-V3?)" in line
    doc = json.loads(run(["explain", "--model", "deepseek-ai/DeepSeek-R1", "--target", "MI355X", "--format", "json"],
                         monkeypatch)[1])
    assert doc["model"]["name"] == "DeepSeek-V3"
    assert any(w.startswith("model deepseek-ai/DeepSeek-R1 is planned as the built-in DeepSeek-V3") for w in
               doc["warnings"])
    doc = json.loads(run(["explain", "--model", "DeepSeek-V3", "--target", "MI355X", "--format", "json"],
                         monkeypatch)[1])
    assert not any("is planned as the built-in" in w for w in doc["warnings"])  # its own name: nothing to say
    table = run(["models"], monkeypatch)[1]
    assert "also known as (HF id, aliases)" in table.splitlines()[0]
    assert "deepseek-ai/DeepSeek-V3, deepseek-ai/DeepSeek-R1" in table
    rows = {r["name"]: r for r in json.loads(run(["models", "--format", "json"], monkeypatch)[1])["models"]}
    assert "deepseek-ai/DeepSeek-R1" in rows["DeepSeek-V3"]["aliases"]


def test_a_dispatch_step_with_other_activations_says_it_is_aiters_own_policy(monkeypatch):
    """Minor 12: MiniMax's aiter line said tokens 1–64 run CK-Tile with bf16 activations while 'not aiter-cktile'
    said CK-Tile would not apply the checkpoint's MXFP4 activation QDQ; the reconciliation was 10 lines further down.
    A step whose activations are not the checkpoint's now says so on its own line."""
    out = run(["explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--aiter-version", "0.1.20.post1",
               "--tp", "8"], monkeypatch)[1]
    steps = [line.strip() for line in out.splitlines() if "tokens 1:" in line or "tokens 512:" in line]
    assert "bf16 activations (AITER's own activation policy, not the checkpoint's mxfp4: see why)" in steps[0]
    assert "mxfp4 activations — " in steps[1] and "own activation policy" not in steps[1]


def test_lint_checks_the_command_line_without_the_model(monkeypatch, tmp_path):
    """Minor 20: an HF repo id not in the local cache stopped lint (exit 2), although option and environment findings
    need no config. Now those are reported, with a warning that the plan's checks did not run."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    code, out, err = run(["lint", "--target", "MI355X", "--format", "json", "--", "vllm", "serve", "acme/Nothing-MoE",
                          "--tensor-paralel-size", "8", "--moe-backend", "aiter"], monkeypatch)
    doc = json.loads(out)
    assert code == 3 and doc["model"] == "acme/Nothing-MoE"
    messages = [(f["severity"], f["message"]) for f in doc["findings"]]
    assert any(s == "error" and "--tensor-paralel-size" in m for s, m in messages)
    assert any(s == "error" and "--moe-backend aiter without VLLM_ROCM_USE_AITER=1" in m for s, m in messages)
    (warn,) = [f for f in doc["findings"] if "cannot read the launch's model" in f["message"]]
    assert warn["severity"] == "warning" and "none of the MoE plan's checks ran" in warn["message"]
    assert warn["fix"].startswith("fetch its config.json first (hf download acme/Nothing-MoE config.json)")


def test_no_citation_of_a_document_the_repository_does_not_hold():
    """Minor 31: DESIGN.md was cited 7 times in code and docs and is not in the repository (it is the team's design
    document, kept beside it): citations point at what a reader of the repository can open."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    hits = subprocess.run(["git", "grep", "-n", "DESIGN.md", "--", ".", ":!tests/test_newcomer_minors.py"],
                          cwd=root, capture_output=True, text=True).stdout
    assert hits == "", hits
