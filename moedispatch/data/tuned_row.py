"""One tuned fused-MoE row of AITER's CSVs, as moedispatch reads it (parsed by :mod:`moedispatch.data.aiter_configs`,
stored per release by :mod:`moedispatch.data.aiter_index`)."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["TunedRow"]


class TunedRow(NamedTuple):
    """One tuned fused-MoE row. ``file`` is the path as shown to users, ``line`` the 1-based line in that file.

    A NamedTuple (immutable, hashable) rather than a dataclass: thousands are built per load and tuple construction
    is an order of magnitude cheaper.
    """

    file: str
    line: int
    gfx: str | None
    cu_num: int
    token: int
    model_dim: int
    inter_dim: int
    expert: int
    topk: int
    act_type: str
    dtype: str
    q_dtype_a: str
    q_dtype_w: str
    q_type: str
    use_g1u1: int
    doweight_stage1: int
    block_m: int
    ksplit: int = 0
    us1: float | None = None
    kernel1: str = ""
    err1: str = ""
    us2: float | None = None
    kernel2: str = ""
    err2: str = ""
    us: float | None = None
    run_1stage: int = 0
    xbf16: int = 0
    flat: int = 0
    tflops: float | None = None
    bw: float | None = None
    tag: str = ""
    gfx_backfilled: bool = False
    defects: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        """``file:line`` — what explain prints as the deciding config."""
        return f"{self.file}:{self.line}"

    @property
    def kernels(self) -> tuple[str, ...]:
        """Kernel names as AITER would launch them (1-stage rows have no stage-2 kernel)."""
        names = [self.kernel1] if self.kernel1 else []
        if not self.run_1stage and self.kernel2 and self.kernel2 not in ("Null", "None"):
            names.append(self.kernel2)
        return tuple(names)

    def key(self, *, with_gfx: bool = True, act: str | None = None) -> tuple:
        """The lookup key (``KEY_COLUMNS``); ``act`` replaces act_type (the wildcard dict)."""
        k = (self.cu_num, self.token, self.model_dim, self.inter_dim, self.expert, self.topk,
             self.act_type if act is None else act, self.dtype, self.q_dtype_a, self.q_dtype_w, self.q_type,
             self.use_g1u1, self.doweight_stage1)
        return ((self.gfx,) + k) if with_gfx else k

    def shape(self) -> tuple:
        """Everything of the key except the token bucket (rows of one tuned shape share it)."""
        k = self.key()
        return k[:2] + k[3:]

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.where, "gfx": self.gfx, "cu_num": self.cu_num, "token": self.token,
            "model_dim": self.model_dim, "inter_dim": self.inter_dim, "expert": self.expert, "topk": self.topk,
            "act_type": self.act_type, "dtype": self.dtype, "q_dtype_a": self.q_dtype_a,
            "q_dtype_w": self.q_dtype_w, "q_type": self.q_type, "use_g1u1": self.use_g1u1,
            "doweight_stage1": self.doweight_stage1, "block_m": self.block_m, "ksplit": self.ksplit,
            "us1": self.us1, "kernel1": self.kernel1, "us2": self.us2, "kernel2": self.kernel2, "us": self.us,
            "run_1stage": self.run_1stage, "xbf16": self.xbf16, "tag": self.tag,
        }
