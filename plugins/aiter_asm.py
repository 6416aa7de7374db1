"""``aiter-asm``: AITER ASM 1-stage fused MoE (``fmoe_g1u1``, ``fmoe_fp8_blockscale_g1u1``; hsa/<gfx>/fmoe/*.csv).

Facts: ROCm/aiter csrc/py_itfs_cu/asm_fmoe.cu, aiter/fused_moe.py fused_moe_1stage_dict, hsa/<gfx>/fmoe/**/*.csv
at v0.1.15.post3. The heuristic picks a kernel whose ``subGU_n``
divides inter_dim ("No suitable kernel found for inter_dim" otherwise); pads are ignored (zero-fill required).
When the probe read the installed AITER's kernel tables, the table for this arch/quant/activation must exist.
"""

from __future__ import annotations

from moedispatch import hookimpl
from moedispatch.core.backend import Padding
from moedispatch.core.capabilities import Capabilities
from moedispatch.core.layers import MoELayer
from moedispatch.core.reason import Reason
from moedispatch.kit.rules import Combo

from moedispatch_plugins._aiter import A3, AiterFamily, tuned_coverage_note

_SRC = f"{A3}:hsa (hsa/<gfx>/fmoe/**/*.csv kernel tables: knl_name, subGU_m, subGU_n); {A3}:csrc/py_itfs_cu/asm_fmoe.cu"

#: subGU_n per (table tag, gfx), read in the kernel tables hsa/<gfx>/fmoe/**/*.csv at v0.1.15.post3.
SUBGU_N = {
    ("pertokenFp8", "gfx942"): (128, 192, 256, 320, 384, 448, 512),
    ("blockscaleFp8", "gfx942"): (128, 256),
    ("blockscaleFp8", "gfx950"): (128, 256, 384),
    ("pertokenMXfp4", "gfx950"): (256, 512),
}


def _subgu(tag: str):
    def multiple(inter: int, gfx: str | None) -> int:
        sizes = SUBGU_N.get((tag, gfx or ""), ())
        if not sizes:
            return 1
        # Smallest padded size >= inter that some kernel's subGU_n divides; return that subGU_n so that
        # round_up(inter, n) lands exactly on it (minimal padding, "no more, no less").
        candidates = [(-(-inter // n) * n, n) for n in sizes]
        return min(candidates)[1]
    return multiple


COMBOS = (
    Combo("fp8", "fp8", ("gfx942",), "ASM 1-stage fmoe_g1u1 per-token fp8 (pertokenFp8)", _SRC,
          weight_granularity=("tensor", "channel"), act_granularity=("tensor", "token"),
          hidden_multiple=128, inter_multiple=_subgu("pertokenFp8")),
    Combo("fp8", "fp8", ("gfx942", "gfx950"), "ASM 1-stage fmoe_fp8_blockscale_g1u1 (blockscaleFp8)",
          _SRC + "; blockscale also needs inter % 128 == 0, bf16 output, 128x128 scale blocks",
          weight_granularity=("block128x128",), act_granularity=("group128", "token"),
          hidden_multiple=128, inter_multiple=_subgu("blockscaleFp8")),
    Combo("mxfp4", "mxfp4", ("gfx950",), "ASM 1-stage fmoe_g1u1 MXFP4 (pertokenMXfp4)", _SRC, feature="mxfp4_moe",
          hidden_multiple=256, inter_multiple=_subgu("pertokenMXfp4")),
)

def _table_tag(combo: Combo) -> str:
    """The kernel-table tag in the combo's kernel name (``pertokenFp8`` …), as in hsa/<gfx>/fmoe/*.csv names."""
    return next(tag for tag in ("pertokenFp8", "blockscaleFp8", "pertokenMXfp4") if tag in combo.kernel)


class AiterAsm(AiterFamily):
    name = "aiter-asm"
    preference = 50
    family = "asm"
    description = "AITER ASM 1-stage fused MoE (hand-written fmoe kernels per arch)"
    combos = COMBOS
    activations = {"silu": "hsa/<gfx>/fmoe/silu tables", "gelu": "hsa/<gfx>/fmoe/gelu tables"}
    bias_supported = False
    bias_source = f"{A3}:aiter/ops/moe_op.py (the asm fmoe bindings take no bias)"
    bias_confidence = "derived"

    def extra_checks(self, layer: MoELayer, caps: Capabilities, combo: Combo | None) -> list[Reason | str]:
        failures = super().extra_checks(layer, caps, combo)
        if combo is not None and caps.aiter_catalog is not None and layer.activation in self.activations:
            tag = _table_tag(combo)
            wanted = f"{caps.gfx}:fmoe_bf16_{tag}_g1u1_{layer.activation}"
            if wanted not in caps.aiter_catalog:
                failures.append(Reason(f"the installed AITER ships no asm kernel table fmoe_bf16_{tag}_g1u1_"
                                       f"{layer.activation} for {caps.gfx} (probed hsa/{caps.gfx}/fmoe catalogs)",
                                       "failed"))
        return failures

    def notes(self, layer: MoELayer, caps: Capabilities, combo: Combo) -> list[Reason | str]:
        notes: list[Reason | str] = [Reason(
            "AITER's heuristic runs ASM 1-stage only in some token ranges (e.g. per_1x128 when tokens > 32); other "
            "batches go to its 2-stage kernels", "note",
            f"{A3}:aiter/fused_moe.py (fused_moe_1stage_dict, get_2stage_cfgs)")]
        if caps.aiter_catalog is not None:
            notes.append(Reason(f"kernel table fmoe_bf16_{_table_tag(combo)}_g1u1_{layer.activation} present in "
                                f"the installed AITER for {caps.gfx}", "supports"))
        return notes + list(tuned_coverage_note(caps))

    def kernel_pads(self, layer: MoELayer, caps: Capabilities,
                    padding: Padding) -> tuple[int, int, list[Reason | str]]:
        notes: list[Reason | str] = []
        if padding.padded:
            notes.append(Reason("kernel pads 0: ASM 1-stage has no pad parameters and computes over the zero-filled "
                                "padded extent", "padding",
                                f"{A3}:csrc/py_itfs_cu/asm_fmoe.cu; {A3}:op_tests/test_moe_2stage.py"))
        return 0, 0, notes


@hookimpl
def register_backends():
    return [AiterAsm()]
