"""docs/support-matrix.md is generated from the selector's own checks and must not go stale."""

from __future__ import annotations

from pathlib import Path

from moedispatch.render import support_matrix

DOC = Path(__file__).parents[1] / "docs" / "support-matrix.md"


def test_committed_support_matrix_is_current():
    """Regenerate with `python -m moedispatch.render.support_matrix > docs/support-matrix.md` when this fails."""
    assert DOC.read_text(encoding="utf-8") == support_matrix.render(), \
        "docs/support-matrix.md is stale: run python -m moedispatch.render.support_matrix > docs/support-matrix.md"


def test_cells_come_from_the_checks():
    """Spot checks against rules with a source: each ✓ carries its AITER range, each ✗ a numbered reason."""
    data = support_matrix.matrix()
    cells = {(arch, label, act): c for arch, rows in data["archs"].items() for label, act, c in rows}
    # FlyDSL a16w4 SiTUv2 runs on gfx942 only from AITER 0.1.20 (ROCm/aiter#4502), on gfx950 from 0.1.19 (#4397).
    assert cells[("gfx942", "mxfp4 × bf16", "situv2")]["aiter-flydsl"][:2] == (True, "AITER ≥ 0.1.20")
    assert cells[("gfx950", "mxfp4 × bf16", "situv2")]["aiter-flydsl"][:2] == (True, "AITER ≥ 0.1.19")
    # AITER's Triton W4A16 (gpt-oss) on gfx942 from 0.1.14 (ROCm/aiter#2770, vllm-project/vllm#50622).
    assert cells[("gfx942", "mxfp4 × bf16", "swigluoai")]["aiter-triton"][:2] == (True, "AITER ≥ 0.1.14")
    # No MX matrix instructions on gfx942: a4w4 has no AITER path there.
    ok, _, reason, _ = cells[("gfx942", "mxfp4 × mxfp4", "silu")]["aiter-ck"]
    assert not ok and "gfx950" in reason
    # Paths outside AITER say so.
    assert cells[("gfx942", "bf16 × bf16", "silu")]["triton"][:2] == (True, "no AITER needed")


def test_rendered_reasons_are_numbered_and_sourced():
    text = support_matrix.render()
    assert "## gfx942" in text and "## gfx950" in text and "✗ [1]" in text
    assert "ROCm/aiter#3886" in text  # the source of the CK swiglu_oai reason
    # engine ranges come from capability_db/engines.toml: AITER families through vLLM and SGLang rows
    assert "| aiter-ck | vLLM >=" in text and "SGLang >=" in text
