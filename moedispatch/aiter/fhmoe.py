"""The dedicated FHMoE table (``aiter/fhmoe.py``, DeepSeek-V4 i384): its rows (:func:`_fhmoe_rows`), the exact-bucket
lookup AITER requires (:func:`fhmoe_lookup`), and the scope checks ``supports_dsv4_i384_fhmoe`` /
``_uses_dsv4_fhmoe_config`` (:func:`fhmoe_supports`, :func:`fhmoe_config_scope`)."""

from __future__ import annotations

import csv
from typing import Any, Mapping

from moedispatch.aiter.env import _env_int
from moedispatch.aiter.rules import get_padded_M
from moedispatch.aiter.vocab import BF16, FP4, FP8, Q_1X32, SILU
from moedispatch.data import capdb


def _fhmoe_rows(path: str | None = None) -> list[dict[str, str]]:
    """The FHMoE table's rows as AITER's CSV spells them: ``path`` (a CSV) when given, else moedispatch's derived
    ``capability_db/aiter_fhmoe.toml`` (main @ e4048607; see ``scripts/build_aiter_index.py --fhmoe``)."""
    if path is None:
        doc = capdb.load_toml("aiter_fhmoe.toml")
        key = {k: str(v) for k, v in doc["key"].items()}
        return [{**key, **{k: str(v) for k, v in row.items() if k != "line"}} for row in doc["row"]]
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))
    except OSError:
        return []


def fhmoe_lookup(token: int, *, model_dim: int = 7168, inter_dim: int = 384, expert: int = 385, topk: int = 7,
                 hidden_pad: int = 0, intermediate_pad: int = 0, gate_mode: str = "interleave",
                 doweight_stage1: bool = False, q_dtype_a: str = FP8, q_dtype_w: str = FP4, gfx: str = "gfx950",
                 cu_num: int = 256, env: Mapping[str, str] | None = None, path: str | None = None
                 ) -> tuple[str, str] | None:
    """``get_2stage_cfgs(config_file=tuned_fhmoe.csv)``: the exact-bucket row's (kernelName1, kernelName2), or None
    where AITER raises ``NotImplementedError('The dedicated FHMoE path requires an exact tuned config row …')``
    (a missing bucket, a duplicate row, or ``AITER_BYPASS_TUNE_CONFIG``). Keys add (shared_expert_id = expert - 1,
    hidden_pad, intermediate_pad, gate_mode) and match the activation as a string (Silu)."""
    if _env_int(dict(env or {}), "AITER_BYPASS_TUNE_CONFIG", 0):
        return None
    gm = "GateMode.INTERLEAVE" if gate_mode == "interleave" else "GateMode.SEPARATED"
    want = {"gfx": gfx, "cu_num": str(cu_num), "token": str(token), "model_dim": str(model_dim),
            "inter_dim": str(inter_dim), "expert": str(expert), "topk": str(topk),
            "shared_expert_id": str(expert - 1), "act_type": SILU, "dtype": BF16, "q_dtype_a": q_dtype_a,
            "q_dtype_w": q_dtype_w, "q_type": Q_1X32, "use_g1u1": "1", "doweight_stage1": str(int(doweight_stage1)),
            "hidden_pad": str(hidden_pad), "intermediate_pad": str(intermediate_pad), "gate_mode": gm}
    rows = _fhmoe_rows(path)
    keys = [tuple(r.get(c, "") for c in want) for r in rows]
    if len(set(keys)) != len(keys):
        return None  # "Duplicate dedicated FHMoE rows"
    for r in rows:
        if all(r.get(c, "").strip() == v for c, v in want.items()):
            return r["kernelName1"], r["kernelName2"]
    return None


def fhmoe_supports(max_tokens: Any, *, env: Mapping[str, str] | None = None, path: str | None = None) -> bool:
    """``aiter.fhmoe.supports_dsv4_i384_fhmoe``: the FHMoE table covers every padded M up to ``max_tokens``."""
    if type(max_tokens) is not int or max_tokens <= 0:
        return False
    required = {get_padded_M(1 << e) for e in range(max_tokens.bit_length())} | {get_padded_M(max_tokens)}
    return all(fhmoe_lookup(t, env=env, path=path) is not None for t in required)


def fhmoe_config_scope(token_num: int, *, model_dim: int, inter_dim: int, experts: int, topk: int, hidden_pad: int,
                       intermediate_pad: int, gate_mode: str, doweight_stage1: bool,
                       env: Mapping[str, str] | None = None, path: str | None = None) -> bool:
    """``aiter.fhmoe._uses_dsv4_fhmoe_config``: the DSv4 i384 contract and a table covering ``token_num``."""
    return ((model_dim, inter_dim, experts, topk) == (7168, 384, 385, 7) and hidden_pad == 0
            and intermediate_pad == 0 and gate_mode == "interleave" and not doweight_stage1
            and fhmoe_supports(token_num, env=env, path=path))
