"""Concurrency and determinism: many threads selecting at once agree exactly; explain JSON never depends on hash seeds."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from moedispatch.data.capdb import target_capabilities
from moedispatch.api import select_moe_backend
from moedispatch.core.decision import NoBackendError
from moedispatch.selector.pure import clear_cache, select_uncached
from moedispatch.selector.plugins import get_registry

# Mixed layers an engine would ask about: several models, quant schemes, TP/EP, and one with no backend.
FIELDS = [
    dict(hidden_size=4096, intermediate_size=14336, num_experts=8, top_k=2, tp_size=8),
    dict(hidden_size=6144, intermediate_size=3072, num_experts=128, top_k=4, tp_size=8, weight_quant="mxfp4",
         activation_quant="mxfp4", activation="swigluoai_uninterleave", model_type="minimax_m3_vl"),
    dict(hidden_size=2880, intermediate_size=2880, num_experts=128, top_k=4, tp_size=2, weight_quant="mxfp4",
         activation_quant="bf16", activation="swigluoai", has_bias=True, model_type="gpt_oss"),
    dict(hidden_size=7168, intermediate_size=2048, num_experts=256, top_k=8, tp_size=8, ep_size=8,
         weight_quant="fp8", weight_granularity="block128x128", activation_quant="fp8",
         activation_granularity="token"),
    dict(hidden_size=4096, intermediate_size=1536, num_experts=128, top_k=8, tp_size=4, weight_quant="fp8",
         activation_quant="fp8", index=7),
    dict(hidden_size=2048, intermediate_size=768, num_experts=128, top_k=8, weight_quant="int4",
         weight_granularity="group128"),
    # forced onto a backend that skips activation QDQ: NoBackendError, never a fallback
    dict(hidden_size=6144, intermediate_size=3072, num_experts=128, top_k=4, tp_size=8, weight_quant="mxfp4",
         activation_quant="mxfp4", force="triton"),
]
TARGETS = [("gfx942", "0.1.15.post3"), ("gfx950", None), ("gfx950", "0.1.13.post1")]


def _outcome(fields, caps):
    try:
        return select_moe_backend(caps=caps, **fields)
    except NoBackendError as exc:
        return ("no-backend", str(exc), exc.decision)


def test_8_threads_x_1000_calls_give_identical_decisions():
    caps = [target_capabilities(t, a) for t, a in TARGETS]
    work = [(f, c) for f in FIELDS for c in caps]
    # Reference: single-threaded and uncached.
    registry = get_registry()
    expected = []
    for fields, c in work:
        from moedispatch.api import _layer_from_fields

        layer_fields = {k: v for k, v in fields.items() if k != "force"}
        try:
            from moedispatch.api import _runtime

            expected.append(select_uncached(_layer_from_fields(layer_fields), c, registry.backends,
                                            fields.get("force"), runtime=_runtime()))
        except NoBackendError as exc:
            expected.append(("no-backend", str(exc), exc.decision))
    clear_cache()
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []
    mismatches: list[tuple[int, int]] = []

    def worker(tid: int) -> None:
        try:
            barrier.wait()
            for i in range(1000):
                j = (i * 7 + tid) % len(work)
                got = _outcome(*work[j])
                if got != expected[j]:
                    mismatches.append((tid, j))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert not mismatches, mismatches[:10]
    assert any(isinstance(e, tuple) for e in expected) and any(not isinstance(e, tuple) for e in expected)


def test_threads_racing_on_a_cold_registry_and_probe_agree(monkeypatch):
    """First use from many threads at once: one registry, one decision."""
    import moedispatch.selector.plugins as mp

    monkeypatch.setenv("MOEDISPATCH_TARGET", "gfx950")
    mp.reset_registry()
    caps = target_capabilities("gfx950")
    out: list = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        out.append((mp.get_registry(), select_moe_backend(caps=caps, **FIELDS[0])))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(out) == 8
    assert len({id(r) for r, _ in out}) == 1
    assert len({d for _, d in out}) == 1


CASES = [
    ("MiniMax-M3-MXFP4", "gfx950", "8"),
    ("MiniMax-M3-MXFP4", "gfx942", "8"),
    ("gpt-oss-120b", "gfx950", "2"),
    ("DeepSeek-V3", "gfx942", "8"),
    ("Qwen3-235B-A22B-Instruct-2507-FP8", "MI355X", "4"),
]


@pytest.mark.parametrize("model, target, tp", CASES)
def test_explain_json_is_byte_identical_across_hash_seeds(model, target, tp):
    outs = set()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOEDISPATCH_", "PYTHONHASHSEED"))}
    for seed in ("0", "4242"):
        proc = subprocess.run(
            [sys.executable, "-m", "moedispatch.cli", "explain", "--model", model, "--target", target, "--tp", tp,
             "--format", "json"], capture_output=True, text=True, env={**env, "PYTHONHASHSEED": seed}, timeout=120)
        assert proc.returncode in (0, 3), proc.stderr
        outs.add(proc.stdout)
    assert len(outs) == 1


@pytest.fixture
def restore_logging():
    import logging

    logger = logging.getLogger("moedispatch")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


def test_explain_json_in_process_equals_a_fresh_process(capsys, restore_logging):
    """Caches (exact and shape-level) never change the output: warm in-process JSON == cold subprocess JSON."""
    from moedispatch.cli import main

    args = ["explain", "--model", "MiniMax-M3-MXFP4", "--target", "gfx950", "--tp", "8", "--format", "json"]
    for _ in range(2):
        assert main(args) == 0
    warm = capsys.readouterr().out
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOEDISPATCH_")}
    cold = subprocess.run([sys.executable, "-m", "moedispatch.cli", *args], capture_output=True, text=True, env=env,
                          timeout=120).stdout
    assert warm == cold + cold
