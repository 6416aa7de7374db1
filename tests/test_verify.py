"""verify: the padded plan read as its pad semantics say (garbage in pads it does not zero-fill), the alignment check,
`verify --backend`, third-party plans that must fail, built-in plans that must pass."""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap
import time

import pytest

pytest.importorskip("torch")

from moedispatch.core.backend import Padding  # noqa: E402
from moedispatch.data.capdb import target_capabilities  # noqa: E402
from moedispatch.core.errors import UsageError  # noqa: E402
from moedispatch.core.layers import MoELayer, QuantSpec  # noqa: E402
from moedispatch.sources.models import expand_layers, load_model  # noqa: E402
from moedispatch.selector.pure import select  # noqa: E402
from moedispatch.numerics.verify import (  # noqa: E402
    CHECK_NAMES, alignment_problems, pad_extents, pad_read_problems, run_verify,
)


def minimax_m3_tp8() -> MoELayer:
    return MoELayer.build(index=3, hidden=6144, intermediate=3072, experts=128, top_k=4, tp=8,
                          activation="swigluoai_uninterleave", activation_params={"alpha": 1.702, "limit": 7.0},
                          weight="mxfp4", act="mxfp4", model="amd/MiniMax-M3-MXFP4")


def by_name(checks: list[dict]) -> dict[str, dict]:
    return {c["name"]: c for c in checks}


def small(activation: str = "swigluoai", bias: bool = True, weight="mxfp4", act="bf16") -> MoELayer:
    """hidden 360 -> 384, intermediate/rank 360 -> 384 at multiples of 128: partial MX blocks in the pads."""
    return MoELayer.build(hidden=360, intermediate=720, experts=16, top_k=3, tp=2, activation=activation,
                          has_bias=bias, weight=weight, act=act)


def unchecked(padding: Padding, **fields) -> Padding:
    """A Padding with fields set past its own validation, as a plugin that bypasses it would hand one over."""
    for key, value in fields.items():
        object.__setattr__(padding, key, value)
    return padding


# -- the built-in shapes and the check list ---------------------------------------------------------------------

def test_minimax_m3_mxfp4_tp8_on_cpu():
    """The headline plan (FlyDSL, 384 -> 512, kernel pads 0, zero-filled: 'compute') passes every check on a CPU."""
    layer = minimax_m3_tp8()
    assert layer.intermediate_per_rank == 384
    padding = Padding.aligned(layer, hidden_multiple=256, intermediate_multiple=256, kernel_intermediate_pad=0)
    assert padding.intermediate_per_rank == 512 and padding.pad_semantics == "compute"
    lines: list[str] = []
    idle = os.getloadavg()[0] < 1.0  # other processes on the 2 cores make torch's thread pool crawl
    t0 = time.perf_counter()
    checks = run_verify(layer, padding, backend="emulation", progress=lines.append)
    elapsed = time.perf_counter() - t0
    assert [c["name"] for c in checks] == list(CHECK_NAMES)
    assert all(set(c) == {"name", "passed", "detail"} for c in checks)
    assert all(c["passed"] is True for c in checks), checks
    exact = by_name(checks)["padding_exact"]["detail"]
    assert "384->512" in exact and "bitwise" in exact and "'compute'" in exact and "zero-filled" in exact
    assert "relative error" in by_name(checks)["quantization_error"]["detail"]
    assert lines and all(isinstance(s, str) for s in lines)
    if idle:
        assert elapsed < 50, elapsed  # typically ~10 s on 2 idle cores


def test_other_backend_is_skipped_on_cpu():
    layer = MoELayer.build(hidden=256, intermediate=192, experts=8, top_k=2, tp=1, weight="fp8", act="fp8")
    checks = by_name(run_verify(layer, Padding.aligned(layer, intermediate_multiple=128), backend="aiter-ck",
                                seed=1))
    b = checks["backend_vs_reference"]
    assert b["passed"] is None and b["detail"].startswith("skipped: ") and "aiter-ck" in b["detail"]
    assert checks["padding_exact"]["passed"] is True and checks["quantization_error"]["passed"] is True


@pytest.mark.parametrize("semantics", ["compute", "skip", "trim"])
@pytest.mark.parametrize("weight,act,activation,bias", [
    ("fp8", "fp8", "silu", False),
    ("bf16", "bf16", "gelu", False),
    ("mxfp4", "bf16", "swigluoai", True),          # gpt-oss style: interleaved gate/up, biases
    ("mxfp4", "mxfp4", "swigluoai_uninterleave", False),
    (QuantSpec("fp8", "block128x128", "fp32", fmt="e4m3fnuz"), QuantSpec("fp8", "block128x128", "fp32", True,
                                                                         "e4m3fnuz"), "silu", False),
    (QuantSpec("int4", "group128", "fp32"), "bf16", "silu", False),
    (QuantSpec("fp8", "channel", "fp32"), QuantSpec("fp8", "token", "fp32", True), "silu", True),
])
def test_zero_filled_plans_pass_under_every_semantics(weight, act, activation, bias, semantics):
    """A zero-filled aligned plan reproduces the unpadded layer bitwise however the kernel reads it."""
    layer = MoELayer.build(hidden=360, intermediate=720, experts=16, top_k=3, tp=2, activation=activation,
                           has_bias=bias, weight=weight, act=act)
    padding = Padding.aligned(layer, hidden_multiple=128, intermediate_multiple=128, pad_semantics=semantics)
    assert padding.padded and padding.zero_fill
    checks = run_verify(layer, padding, backend="emulation", tokens=5)
    assert all(c["passed"] is True for c in checks), checks
    assert f"'{semantics}'" in checks[0]["detail"]


# -- pads that are not zero-filled, kernel pads that are wrong ---------------------------------------------------

@pytest.mark.parametrize("activation,act", [("swigluoai", "bf16"), ("silu", QuantSpec("fp8", "token", "fp32", True))])
def test_unzeroed_pads_fail_under_compute_and_pass_where_skipped(activation, act):
    """Garbage pads: 'compute' reads them (fails, numerically too); 'skip'/'trim' with the real kernel pads never
    read them (passes)."""
    layer = small(activation=activation, act=act)
    for semantics in ("compute", "skip", "trim"):
        padding = dataclasses.replace(Padding.aligned(layer, hidden_multiple=128, intermediate_multiple=128,
                                                      pad_semantics=semantics), zero_fill=False)
        exact = run_verify(layer, padding, backend="emulation", tokens=5, seed=7)[0]
        assert exact["name"] == "padding_exact"
        if semantics == "compute":
            assert exact["passed"] is False, exact
            assert exact["detail"].startswith("pad regions not zero-filled under 'compute'"), exact
            assert "the output differs from the unpadded layer" in exact["detail"], exact
        else:
            assert exact["passed"] is True, (semantics, exact)
            assert "not zero-filled, so they hold garbage" in exact["detail"]


def test_unzeroed_hidden_pad_alone_fails_under_compute():
    """Only the hidden dimension padded: the activation pad is zero, but garbage (NaN) times zero is still NaN."""
    layer = MoELayer.build(hidden=360, intermediate=256, experts=8, top_k=2, weight="bf16", act="bf16")
    padding = dataclasses.replace(Padding.aligned(layer, hidden_multiple=128, intermediate_multiple=128),
                                  zero_fill=False)
    assert padding.hidden_pad == 24 and padding.intermediate_pad == 0
    exact = run_verify(layer, padding, backend="emulation", tokens=4, seed=3)[0]
    assert exact["passed"] is False
    assert "pad regions not zero-filled under 'compute'" in exact["detail"] and "hidden 360..383" in exact["detail"]
    assert "NaN in" in exact["detail"]


@pytest.mark.parametrize("semantics", ["skip", "trim"])
def test_kernel_pad_too_small_reads_unzeroed_pads(semantics):
    layer = small()
    base = Padding.aligned(layer, hidden_multiple=128, intermediate_multiple=128, pad_semantics=semantics)
    padding = dataclasses.replace(base, zero_fill=False, kernel_intermediate_pad=8)
    exact = run_verify(layer, padding, backend="emulation", tokens=5, seed=11)[0]
    assert exact["passed"] is False
    assert exact["detail"].startswith(f"kernel_intermediate_pad 8 leaves intermediate pad columns 360..375 read under "
                                      f"'{semantics}'"), exact
    assert "the output differs from the unpadded layer" in exact["detail"]
    # the same short kernel pad over zero-filled pads is harmless: the kernel computes over zeros
    ok = run_verify(layer, dataclasses.replace(base, kernel_intermediate_pad=8), backend="emulation", tokens=5)[0]
    assert ok["passed"] is True, ok
    hidden = dataclasses.replace(base, zero_fill=False, kernel_hidden_pad=0)
    exact = run_verify(layer, hidden, backend="emulation", tokens=5, seed=11)[0]
    assert exact["passed"] is False and f"kernel_hidden_pad 0 leaves hidden pad columns 360..383 read under " \
                                         f"'{semantics}'" in exact["detail"], exact


def test_kernel_pad_too_large_skips_real_data():
    """vLLM pre-doubled the intermediate pad (304 for 152: vllm-project/vllm#44679): the kernel skips real columns,
    zero-filled or not."""
    layer = MoELayer.build(hidden=2880, intermediate=2880, experts=32, top_k=4, tp=8, activation="swigluoai",
                           has_bias=True, weight="mxfp4", act="bf16")
    base = Padding.aligned(layer, hidden_multiple=256, intermediate_multiple=256, pad_semantics="skip")
    assert (layer.intermediate_per_rank, base.intermediate_pad) == (360, 152)
    padding = unchecked(base, kernel_intermediate_pad=304)
    exact = run_verify(layer, padding, backend="emulation", experts=4, tokens=4, seed=5)[0]
    assert exact["passed"] is False
    assert exact["detail"].startswith("kernel_intermediate_pad 304 skips real intermediate columns 208..359 under "
                                      "'skip'"), exact
    assert "max |diff|" in exact["detail"]
    hidden = unchecked(Padding.aligned(layer, hidden_multiple=256, intermediate_multiple=256, pad_semantics="trim"),
                       kernel_hidden_pad=256)
    exact = run_verify(layer, hidden, backend="emulation", experts=4, tokens=4, seed=5)[0]
    assert exact["passed"] is False and "kernel_hidden_pad 256 skips real hidden columns 2816..2879 under 'trim'" \
        in exact["detail"], exact


def test_kernel_pad_beyond_the_allocation_reads_nothing_and_fails():
    layer = MoELayer.build(hidden=256, intermediate=384, experts=8, top_k=2, weight="mxfp4", act="mxfp4")
    padding = unchecked(Padding.aligned(layer, hidden_multiple=256, intermediate_multiple=256, pad_semantics="skip"),
                        kernel_hidden_pad=5000, kernel_intermediate_pad=5000)
    assert pad_extents(padding) == (0, 0)
    exact = run_verify(layer, padding, backend="emulation", tokens=3, seed=1)[0]
    assert exact["passed"] is False and "kernel_hidden_pad 5000 skips real hidden columns 0..255" in exact["detail"]
    assert "kernel_intermediate_pad 5000 skips real intermediate columns 0..383" in exact["detail"]


def test_compute_ignores_kernel_pads():
    """Under 'compute' the kernel pads are not arguments the kernel reads: zero-filled passes whatever they say."""
    layer = small()
    padding = Padding.aligned(layer, hidden_multiple=128, intermediate_multiple=128, kernel_intermediate_pad=0,
                              kernel_hidden_pad=0)
    assert pad_extents(padding) == (384, 384)
    assert run_verify(layer, padding, backend="emulation", tokens=3)[0]["passed"] is True


def test_pad_read_problems_table():
    layer = small()
    base = Padding.aligned(layer, hidden_multiple=128, intermediate_multiple=128, pad_semantics="skip")
    assert pad_extents(base) == (360, 360)
    assert pad_read_problems(360, 360, base) == []
    assert pad_read_problems(360, 360, dataclasses.replace(base, zero_fill=False)) == []
    assert pad_read_problems(360, 360, dataclasses.replace(base, kernel_intermediate_pad=0)) == []
    [p] = pad_read_problems(360, 360, dataclasses.replace(base, kernel_intermediate_pad=0, zero_fill=False))
    assert p.startswith("kernel_intermediate_pad 0 leaves intermediate pad columns 360..383 read under 'skip'")
    [p] = pad_read_problems(360, 360, unchecked(dataclasses.replace(base), kernel_hidden_pad=64))
    assert p.startswith("kernel_hidden_pad 64 skips real hidden columns 320..359 under 'skip'")
    compute = dataclasses.replace(base, pad_semantics="compute", zero_fill=False)
    [p] = pad_read_problems(360, 360, compute)
    assert p.startswith("pad regions not zero-filled under 'compute'") and "intermediate 360..383" in p
    assert pad_read_problems(360, 360, Padding(hidden=360, intermediate_per_rank=360)) == []


# -- alignment ---------------------------------------------------------------------------------------------------

def test_padding_far_beyond_the_declared_alignment_is_reported():
    """384 padded to 1024 where the multiple is 256 (minimal round-up 512): reported, though numerically exact."""
    layer = MoELayer.build(hidden=256, intermediate=384, experts=8, top_k=2, weight="mxfp4", act="mxfp4",
                           activation="silu")
    padding = Padding(hidden=256, intermediate_per_rank=1024, intermediate_pad=640, kernel_intermediate_pad=640,
                      zero_fill=True, hidden_multiple=256, intermediate_multiple=256, pad_semantics="skip")
    checks = by_name(run_verify(layer, padding, backend="emulation", tokens=4))
    assert checks["padding_exact"]["passed"] is True
    align = checks["padding_alignment"]
    assert align["passed"] is False
    assert align["detail"].startswith("intermediate/rank padded 384->1024: 512 beyond the minimal round-up 512 to the "
                                      "declared intermediate_multiple 256"), align


@pytest.mark.parametrize("padded,multiple,ok,needle", [
    (512, 256, True, ""),                 # the minimal round-up
    (768, 256, True, ""),                 # one multiple beyond (an engine's coarser convention)
    (1024, 256, False, "more than one multiple"),
    (640, 256, False, "not a multiple of the declared intermediate_multiple 256"),
    (512, 1, False, "more than one multiple"),  # pads with no declared alignment
    (385, 1, True, ""),
])
def test_alignment_problems_table(padded, multiple, ok, needle):
    padding = Padding(hidden=256, intermediate_per_rank=padded, intermediate_pad=padded - 384, zero_fill=True,
                      hidden_multiple=256, intermediate_multiple=multiple)
    problems, summary = alignment_problems(256, 384, padding)
    assert (not problems) is ok, problems
    assert needle in " ".join(problems)
    assert f"intermediate/rank 384->{padded}" in summary


# -- the numbers behind a failure are real ---------------------------------------------------------------------

def test_seed_reproducible_and_fresh_by_default():
    layer = MoELayer.build(hidden=128, intermediate=64, experts=4, top_k=2, weight="mxfp4", act="mxfp4")
    pad = Padding.none(layer)
    a = run_verify(layer, pad, backend="emulation", seed=42)
    b = run_verify(layer, pad, backend="emulation", seed=42)
    strip = lambda cs: [c["detail"].split("(information")[0] for c in cs]  # noqa: E731 - drop the timing
    assert strip(a) == strip(b)
    c = run_verify(layer, pad, backend="emulation")
    d = run_verify(layer, pad, backend="emulation")
    assert c[0]["detail"] != d[0]["detail"]  # different OS-random seeds
    assert "no padding" in a[0]["detail"]
    assert all(x["passed"] is True for x in a), a


def test_bad_arguments_and_dense_layers():
    layer = MoELayer.build(hidden=128, intermediate=64, experts=4, top_k=2)
    with pytest.raises(UsageError):
        run_verify(layer, Padding(hidden=256, intermediate_per_rank=64), backend="emulation")
    with pytest.raises(UsageError):
        run_verify(layer, Padding.none(layer), backend="emulation", tokens=0)
    dense = MoELayer.build(kind="dense", hidden=128, intermediate=64)
    checks = run_verify(dense, Padding.none(dense), backend="emulation")
    assert [c["name"] for c in checks] == list(CHECK_NAMES)
    assert all(c["passed"] is None and c["detail"].startswith("skipped: ") for c in checks)


# -- built-in plans, as the selector makes them ------------------------------------------------------------------

BUILTIN_CASES = [
    # model, target, tp, forced backend, expected backend, expected semantics
    ("MiniMax-M3-MXFP4", "gfx950", 8, None, "aiter-flydsl", "compute"),
    ("gpt-oss-120b", "gfx950", 8, "aiter-cktile", "aiter-cktile", "skip"),
    ("gpt-oss-20b", "gfx942", 4, None, "aiter-triton", "compute"),
    ("gpt-oss-20b", "gfx942", 4, "triton", "triton", "trim"),
]


@pytest.mark.parametrize("model,target,tp,force,expected,semantics", BUILTIN_CASES)
def test_builtin_plans_pass_and_their_semantics_matter(builtins, model, target, tp, force, expected, semantics):
    """Each built-in plan passes; the same plan without zero-fill fails exactly where the kernel reads its pads."""
    layer = next(la for la in expand_layers(load_model(model), tp) if la.kind == "moe")
    decision = select(layer, target_capabilities(target, None), builtins, force=force)
    assert (decision.backend, decision.padding.pad_semantics) == (expected, semantics)
    padding = decision.padding
    assert padding.padded and padding.zero_fill
    checks = run_verify(layer, padding, backend=decision.backend, experts=4, tokens=4, seed=1)
    assert all(c["passed"] is not False for c in checks), checks
    unzeroed = run_verify(layer, dataclasses.replace(padding, zero_fill=False), backend=decision.backend, experts=4,
                          tokens=4, seed=1)[0]
    reads_pads = semantics == "compute" or padding.kernel_hidden_pad < padding.hidden_pad \
        or padding.kernel_intermediate_pad < padding.intermediate_pad
    assert unzeroed["passed"] is (not reads_pads), unzeroed
    assert reads_pads is (semantics == "compute")  # CK-Tile and Triton get the real pads


# -- the CLI: verify --backend, third-party plans ----------------------------------------------------------------

PLUGIN = textwrap.dedent('''
    """Backends whose plans get the pad semantics wrong, for tests/test_verify.py."""
    import dataclasses

    from moedispatch import Backend, Padding, Verdict, hookimpl


    class _Acme(Backend):
        def check(self, layer, caps):
            return Verdict.supported("runs any layer (test plugin)")


    class Unzeroed(_Acme):
        """A classic-CK-like kernel over pads that are never zero-filled (allocated with torch.empty)."""
        name = "acme-unzeroed"
        preference = 10000

        def plan_padding(self, layer, caps):
            p = Padding.aligned(layer, hidden_multiple=256, intermediate_multiple=256, pad_semantics="compute")
            return dataclasses.replace(p, zero_fill=False)


    class ShortPad(_Acme):
        """A pad-skipping kernel told to skip nothing, over unzeroed pads."""
        name = "acme-shortpad"

        def plan_padding(self, layer, caps):
            p = Padding.aligned(layer, hidden_multiple=256, intermediate_multiple=256, kernel_intermediate_pad=0,
                                pad_semantics="skip")
            return dataclasses.replace(p, zero_fill=False)


    class Doubled(_Acme):
        """A pad-skipping kernel given twice the intermediate pad (the pre-doubling of vllm-project/vllm#42098)."""
        name = "acme-doubled"

        def plan_padding(self, layer, caps):
            p = Padding.aligned(layer, hidden_multiple=256, intermediate_multiple=256, pad_semantics="skip")
            object.__setattr__(p, "kernel_intermediate_pad", 2 * p.intermediate_pad)
            return p


    @hookimpl
    def register_backends():
        return [Unzeroed(), ShortPad(), Doubled()]
''')

SMALL_RUN = ("--model", "gpt-oss-20b", "--target", "gfx950", "--tp", "4", "--experts", "4", "--tokens", "4",
             "--seed", "3", "--format", "json", "-q")


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    """A third-party plugin distribution on PYTHONPATH (module + dist-info with an entry point)."""
    root = tmp_path_factory.mktemp("acme_pads")
    (root / "acme_pads.py").write_text(PLUGIN)
    dist = root / "acme_pads-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-pads\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[moedispatch.backends]\nacme_pads = acme_pads\n")
    return {"PYTHONPATH": str(root)}


def _verify_json(cli, *args, env=None):
    proc = cli("verify", *args, env=env, timeout=300)
    assert proc.stdout.strip(), proc.stderr
    return proc, json.loads(proc.stdout)


def test_cli_selected_plugin_with_unzeroed_pads_is_never_selected(cli, plugin_env):
    """A plugin whose plan leaves compute-semantics pads unzeroed breaks the pad contract: the selector rejects it
    (a plugin error) before verify would run it, so verify checks the backend selected instead and passes. (The
    numeric check that shows such a plan wrong is tested directly above: 'pad regions not zero-filled …'.)"""
    proc, out = _verify_json(cli, *SMALL_RUN, env=plugin_env)
    assert proc.returncode == 0, proc.stderr
    assert out["schema"] == "moedispatch.verify/1" and out["backend"] != "acme-unzeroed"
    assert all(c["passed"] is not False for c in out["checks"])


def test_cli_forced_plugin_that_breaks_the_pad_contract_is_refused(cli, plugin_env):
    """--backend acme-shortpad (a kernel pad smaller than the allocated one, no zero_fill): one line naming the pad
    contract, exit 3 — the plan is refused before any numerics."""
    proc = cli("verify", *SMALL_RUN, "--backend", "acme-shortpad", env=plugin_env, timeout=300)
    assert proc.returncode == 3, proc.stderr
    assert "forced backend 'acme-shortpad' cannot run this layer: plugin error: plan_padding() breaks the pad " \
           "contract" in proc.stderr


def test_cli_forced_plugin_with_a_kernel_pad_over_real_columns_fails(cli, plugin_env):
    """A kernel pad that skips real columns keeps the pad contract but is wrong: verify's numerics catch it."""
    proc, out = _verify_json(cli, *SMALL_RUN, "--backend", "acme-doubled", env=plugin_env)
    assert proc.returncode == 1, proc.stderr
    assert out["backend"] == "acme-doubled"
    exact = by_name(out["checks"])["padding_exact"]
    assert exact["passed"] is False and exact["detail"].startswith(
        "kernel_intermediate_pad 96 skips real intermediate columns 672..719 under 'skip'"), exact


def test_cli_builtin_minimax_m3_tp8_passes(cli):
    """The headline plan with verify's defaults (reduced expert count), through the console script."""
    proc, out = _verify_json(cli, "--model", "MiniMax-M3-MXFP4", "--target", "gfx950", "--tp", "8", "--format", "json",
                             "-q")
    assert proc.returncode == 0, (proc.stderr, out)
    assert out["backend"] == "aiter-flydsl" and out["padding"]["intermediate_per_rank"] == 512
    checks = by_name(out["checks"])
    assert [c["name"] for c in out["checks"]] == list(CHECK_NAMES)
    assert checks["padding_exact"]["passed"] is True and checks["padding_alignment"]["passed"] is True


@pytest.mark.parametrize("args,backend,semantics", [
    (("--model", "gpt-oss-120b", "--target", "gfx950", "--tp", "8", "--backend", "aiter-cktile"), "aiter-cktile",
     "skip"),
    (("--model", "gpt-oss-20b", "--target", "gfx942", "--tp", "4", "--backend", "triton"), "triton", "trim"),
])
def test_cli_builtin_skip_and_trim_plans_pass(cli, args, backend, semantics):
    proc, out = _verify_json(cli, *args, "--experts", "4", "--tokens", "4", "--format", "json", "-q")
    assert proc.returncode == 0, (proc.stderr, out)
    assert out["backend"] == backend and out["padding"]["pad_semantics"] == semantics
    assert by_name(out["checks"])["padding_exact"]["passed"] is True


def test_cli_backend_errors(cli):
    """Unknown name: exit 2, one line. A forced backend that cannot run the layer: exit 3 with its reasons."""
    proc = cli("verify", "--model", "MiniMax-M3-MXFP4", "--target", "gfx950", "--tp", "8", "--backend", "nope")
    assert proc.returncode == 2 and not proc.stdout
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "unknown backend 'nope'" in proc.stderr
    proc = cli("verify", "--model", "Qwen3-235B-A22B-Instruct-2507-MXFP4", "--target", "gfx950", "--tp", "8",
               "--backend", "aiter-cktile")
    assert proc.returncode == 3 and not proc.stdout
    assert "forced backend 'aiter-cktile' cannot run this layer" in proc.stderr and "MXFP4" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_emulation_rounds_mx_scales_as_aiter_toml_says(monkeypatch):
    """capability_db/aiter.toml [numerics.mxfp4_dynamic_scale] rounding is what the emulation runner uses (AITER's
    dynamic_mxfp4_quant rounds "even"); a different value in the data reaches the runner."""
    pytest.importorskip("torch")
    from moedispatch.data import capdb
    from moedispatch.core.layers import MoELayer
    from moedispatch.selector.plugins import build_registry

    emu = build_registry().get("emulation")
    layer = MoELayer.build(hidden=64, intermediate=64, experts=2, top_k=1, weight="mxfp4", act="mxfp4")
    assert capdb.load_toml("aiter.toml")["numerics"]["mxfp4_dynamic_scale"]["rounding"] == "even"
    assert emu.runner(layer).scale_rounding == "even"
    real = capdb.load_toml

    def patched(name):
        data = real(name)
        if name == "aiter.toml":
            data = {**data, "numerics": {"mxfp4_dynamic_scale": {"rounding": "floor"}}}
        return data

    monkeypatch.setattr(capdb, "load_toml", patched)
    assert emu.runner(layer).scale_rounding == "floor"
