"""Read a checkpoint folder without loading it: safetensors headers, the shard index, the local HF cache.

Only the JSON header of each ``*.safetensors`` shard is read (8-byte little-endian length, then that many bytes of
JSON; safetensors format spec, huggingface/safetensors README). Tensor data is never read, nothing in the folder is
imported or executed, nothing is written, and the network is never used. Every problem is one
:class:`~moedispatch.core.errors.ModelError` line that names the file and the problem.

The HF cache lookup follows the huggingface_hub cache layout (``$HF_HUB_CACHE`` or ``$HF_HOME/hub`` or
``~/.cache/huggingface/hub``; ``models--{org}--{name}/refs/{revision}`` holds a commit hash, the files are under
``snapshots/{commit}/``) without depending on huggingface_hub.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from moedispatch.core.errors import ModelError

__all__ = [
    "TensorInfo", "ExpertLayout", "CheckpointInfo", "read_safetensors_header", "scan_checkpoint",
    "analyse_experts", "expert_module_names", "hf_cache_dir", "resolve_hf_cache", "safe_stat", "is_repo_id",
    "MAX_HEADER_BYTES", "PREPAD_MAX_MULTIPLE", "prepad_multiple",
]

#: Largest safetensors header accepted. Real headers are well under 10 MB (a 163-shard DeepSeek-V3 shard header is
#: ~100 KB); the safetensors crate itself refuses headers over 100 MB (``N_MAX_HEADER`` = 100_000_000).
MAX_HEADER_BYTES = 100_000_000
_MAX_INDEX_BYTES = 64 * 1024 * 1024
_MAX_SHARDS = 20_000

# Byte width per element of the safetensors dtypes (huggingface/safetensors ``Dtype``); sub-byte ones in bits.
_DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "C64": 64,
}


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def safe_stat(path: Path, what: str = "") -> os.stat_result | None:
    """stat() following links; None if absent; ModelError for a symlink loop or an unreadable path."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ModelError(f"{path}: symlink loop{' (' + what + ')' if what else ''}") from None
        if exc.errno == errno.ENAMETOOLONG:
            raise ModelError(f"{str(path)[:120]}...: file name too long") from None
        raise ModelError(f"{path}: cannot access: {exc.strerror or exc}") from None


# -- safetensors headers ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str


def read_safetensors_header(path: Path, *, max_header: int = MAX_HEADER_BYTES) -> dict[str, TensorInfo]:
    """Tensor name -> TensorInfo from one shard's header; validates the header against the file size."""
    st = safe_stat(path)
    if st is None:
        raise ModelError(f"{path}: no such file")
    size = st.st_size
    if size < 8:
        raise ModelError(f"{path}: truncated safetensors file ({size} bytes, the 8-byte header length is missing)")
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if head == b"version " and b"git-lfs" in fh.read(200):  # a Git LFS pointer file, not the weights
                raise ModelError(f"{path}: a Git LFS pointer, not the safetensors file; fetch the weights with "
                                 "`git lfs pull` (or `hf download`)")
            (n,) = struct.unpack("<Q", head)
            if n > max_header:
                raise ModelError(f"{path}: safetensors header claims {n} bytes, over the {max_header} byte limit")
            if n + 8 > size:
                raise ModelError(f"{path}: safetensors header length {n} runs beyond the end of the file "
                                 f"({size} bytes)")
            if n < 2:
                raise ModelError(f"{path}: safetensors header length {n} is too small for a JSON object")
            raw = fh.read(n)
    except ModelError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ModelError(f"{path}: symlink loop") from None
        raise ModelError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) != n:
        raise ModelError(f"{path}: file shrank while reading the safetensors header")
    try:
        header = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ModelError(f"{path}: safetensors header is not UTF-8") from None
    except ValueError as exc:
        raise ModelError(f"{path}: safetensors header is not valid JSON: {exc}") from None
    except RecursionError:
        raise ModelError(f"{path}: safetensors header nests too deeply") from None
    if not isinstance(header, dict):
        raise ModelError(f"{path}: safetensors header must be a JSON object, got {type(header).__name__}")
    data_len = size - 8 - n
    out: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            if entry is not None and not isinstance(entry, dict):
                raise ModelError(f"{path}: safetensors __metadata__ must be an object")
            continue
        where = f"{path}: tensor {_short(name)}"
        if not isinstance(entry, dict):
            raise ModelError(f"{where}: header entry must be an object, got {type(entry).__name__}")
        dtype = entry.get("dtype")
        shape = entry.get("shape")
        offsets = entry.get("data_offsets")
        if not isinstance(dtype, str) or not dtype:
            raise ModelError(f"{where}: dtype must be a string, got {_short(dtype)}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                   for d in shape):
            raise ModelError(f"{where}: shape must be a list of non-negative integers, got {_short(shape)}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
            raise ModelError(f"{where}: data_offsets must be two integers, got {_short(offsets)}")
        begin, end = offsets
        if not 0 <= begin <= end:
            raise ModelError(f"{where}: data_offsets {offsets} are not an increasing non-negative range")
        if end > data_len:
            raise ModelError(f"{where}: data_offsets end {end} lies beyond the file's {data_len} data bytes")
        bits = _DTYPE_BITS.get(dtype.upper())
        if bits is not None:
            expected = math.ceil(math.prod(shape) * bits / 8)
            if end - begin != expected:
                raise ModelError(f"{where}: {dtype} {shape} needs {expected} bytes but data_offsets span "
                                 f"{end - begin}")
        out[name] = TensorInfo(name, dtype.upper(), tuple(shape), str(path))
    return out


# -- shard discovery -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckpointInfo:
    """What the folder's weight files say (empty when there are none)."""

    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    shards: tuple[str, ...] = ()
    missing_shards: tuple[str, ...] = ()
    index_names: tuple[str, ...] = ()  # names listed by the index whose shard is not present

    @property
    def has_tensors(self) -> bool:
        return bool(self.tensors)


def _read_index(path: Path) -> dict[str, str]:
    st = safe_stat(path)
    if st is None:
        return {}
    if st.st_size > _MAX_INDEX_BYTES:
        raise ModelError(f"{path}: {st.st_size} bytes is too large for a safetensors index")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise ModelError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ModelError(f"{path}: not UTF-8") from None
    except ValueError as exc:
        raise ModelError(f"{path}: not valid JSON: {exc}") from None
    except RecursionError:
        raise ModelError(f"{path}: JSON nests too deeply") from None
    if not isinstance(data, dict) or not isinstance(data.get("weight_map"), dict):
        raise ModelError(f"{path}: must be an object with a weight_map object")
    wmap = data["weight_map"]
    for name, shard in wmap.items():
        if not isinstance(shard, str) or not shard:
            raise ModelError(f"{path}: weight_map[{_short(name)}] must be a file name, got {_short(shard)}")
        if "/" in shard or "\\" in shard or shard in (".", "..") or shard.startswith("."):
            raise ModelError(f"{path}: weight_map[{_short(name)}] = {_short(shard)} is not a file in this folder")
    return wmap


def scan_checkpoint(folder: Path) -> CheckpointInfo:
    """Read every shard header of the folder (via model.safetensors.index.json when there is one)."""
    index = _read_index(folder / "model.safetensors.index.json")
    if index:
        wanted = sorted(set(index.values()))
    else:
        try:
            wanted = sorted(p.name for p in folder.iterdir() if p.name.endswith(".safetensors"))
        except OSError as exc:
            raise ModelError(f"{folder}: cannot list: {exc.strerror or exc}") from None
    if len(wanted) > _MAX_SHARDS:
        raise ModelError(f"{folder}: {len(wanted)} safetensors shards is implausibly many")
    present, missing = [], []
    for shard in wanted:
        (present if safe_stat(folder / shard) is not None else missing).append(shard)
    tensors: dict[str, TensorInfo] = {}
    for shard in present:
        for name, info in read_safetensors_header(folder / shard).items():
            if index and index.get(name, shard) != shard:
                continue  # the index says another shard owns it
            tensors[name] = info
    missing_set = set(missing)
    index_only = tuple(sorted(n for n, s in index.items() if s in missing_set)) if index else ()
    return CheckpointInfo(tensors, tuple(present), tuple(missing), index_only)


# -- expert tensor analysis ------------------------------------------------------------------------------------

# Expert weight names across families (HF checkpoints):
#   per-expert:  ...layers.{i}.{mlp|block_sparse_moe|feed_forward|moe_block}.experts.{e}.{gate_proj|up_proj|down_proj|
#                w1|w3|w2|gate_up_proj|w13|linear|linear_v|linear_1}.{weight|weight_packed}
#   stacked:     ...layers.{i}.mlp.experts.{gate_up_proj|down_proj}            (gpt-oss bf16, Llama-4, HF v5 fused)
#                ...layers.{i}.mlp.experts.{gate_up_proj|down_proj}_blocks     (gpt-oss MXFP4, openai/gpt-oss-120b)
_EXPERT_RE = re.compile(
    r"^(?P<prefix>.*?)layers\.(?P<layer>\d+)\.(?:[A-Za-z0-9_]+\.)*?experts\."
    r"(?:(?P<expert>\d+)\.)?"
    r"(?P<proj>gate_up_proj|gate_proj|up_proj|down_proj|w13|w1|w2|w3|linear_v|linear_1|linear)"
    r"(?:(?P<blocks>_blocks)|(?P<bias>_bias|\.bias)|\.(?P<leaf>weight|weight_packed))?$"
)
_ROLE = {"gate_up_proj": "gate_up", "w13": "gate_up", "gate_proj": "gate", "w1": "gate", "linear": "gate",
         "up_proj": "up", "w3": "up", "linear_v": "up", "down_proj": "down", "w2": "down", "linear_1": "down"}

#: Weight storage dtypes each label can have on disk (packed sub-byte formats live in U8/I8/I32).
_DTYPES_FOR = {
    "bf16": {"BF16", "F16", "F32"}, "fp16": {"BF16", "F16", "F32"},
    "fp8": {"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "U8", "I8"},
    "mxfp8": {"F8_E4M3", "F8_E5M2", "U8"},
    "mxfp4": {"U8", "I8", "F4"}, "mxfp6": {"U8", "F6_E2M3", "F6_E3M2"},
    "int8": {"I8", "U8"}, "int4": {"I32", "U32", "I8", "U8"},
}


#: The largest multiple a pre-padded checkpoint may round its expert intermediate size up to. A stored size larger
#: than config.json's is pre-padding only when it is that size rounded up to a power-of-two multiple of 16 …
#: PREPAD_MAX_MULTIPLE (gpt-oss 2880 → 3072 is a round-up to 256, vLLM's MXFP4 rule on ROCm; GLM-4.5-Air 1408 → 1536
#: at TP8 is 176 → 192 per rank, a round-up to 256). Anything else — 2× the size, +1000 — is a wrong checkpoint or a
#: fused gate_up tensor under a gate/up name, and an error. The hidden size is never pre-padded.
PREPAD_MAX_MULTIPLE = 1024


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def prepad_multiple(config: int, stored: int) -> int | None:
    """The smallest power-of-two multiple (16 … :data:`PREPAD_MAX_MULTIPLE`) that rounds ``config`` up to ``stored``;
    None when ``stored`` is no such round-up, not larger than ``config``, or a whole multiple of it (2× is a fused
    gate_up or another model, even where a round-up would reach it: 512 → 1024)."""
    if stored <= config or stored % config == 0:
        return None
    multiple = 16
    while multiple <= PREPAD_MAX_MULTIPLE:
        if _round_up(config, multiple) == stored:
            return multiple
        multiple *= 2
    return None


@dataclass(frozen=True)
class ExpertLayout:
    """What the expert tensors say, cross-checked against the config."""

    stored_intermediate: int | None = None
    stored_hidden: int | None = None
    fused_gate_up: bool | None = None
    stacked: bool | None = None
    has_bias: bool = False
    weight_dtypes: tuple[str, ...] = ()
    moe_layers: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()


def _pack_factor(name: str, dtype: str, label: str, blocks: bool) -> int:
    if blocks:
        return 1  # handled by merging the last two dims
    if dtype in ("I32", "U32"):
        return 8  # eight int4 per 32-bit word (Grok INT4-FP8, compressed-tensors pack-quantized)
    if dtype in ("U8", "I8") and label in ("mxfp4", "int4"):
        return 2  # two 4-bit values per byte
    return 1


def _logical(info: TensorInfo, label: str, blocks: bool) -> tuple[int, ...]:
    shape = info.shape
    if blocks:
        if len(shape) < 3:
            raise ModelError(f"{info.file}: tensor {info.name} {list(shape)} is not an MXFP4 blocks tensor "
                             "(expected [..., K/32, 16])")
        return shape[:-2] + (shape[-2] * shape[-1] * 2,)
    if not shape:
        raise ModelError(f"{info.file}: tensor {info.name} is a scalar, not an expert weight")
    return shape[:-1] + (shape[-1] * _pack_factor(info.name, info.dtype, label, blocks),)


def _collect_experts(tensors: dict[str, TensorInfo], n_layers: int) -> tuple[dict[int, dict[str, Any]], bool]:
    """(layer -> its expert tensors by role and expert ids, whether any expert bias exists) from the tensor names."""
    per_layer: dict[int, dict[str, Any]] = {}
    bias = False
    for name, info in tensors.items():
        m = _EXPERT_RE.match(name)
        if m is None:
            continue
        if m.group("bias"):
            bias = True
            continue
        layer = int(m.group("layer"))
        if layer >= n_layers:
            continue  # MTP / next-n layers past num_hidden_layers
        entry = per_layer.setdefault(layer, {"experts": set(), "stacked": None, "roles": {}})
        role = _ROLE[m.group("proj")]
        entry["roles"].setdefault(role, []).append((info, m.group("blocks") is not None, m.group("expert")))
        if m.group("expert") is not None:
            entry["experts"].add(int(m.group("expert")))
    return per_layer, bias


def _check_coverage(per_layer: dict[int, dict[str, Any]], moe_set: set[int], where: str, complete: bool) -> None:
    """Raise when experts sit in a dense layer, or (``complete``) a MoE layer has no expert tensors."""
    for layer in sorted(per_layer):
        if layer not in moe_set:
            name = next(iter(per_layer[layer]["roles"].values()))[0][0]
            raise ModelError(f"{name.file}: tensor {name.name} holds experts for layer {layer}, but {where} makes "
                             f"layer {layer} a dense layer")
    for layer in sorted(moe_set) if complete else ():
        if layer not in per_layer:
            any_layer = min(per_layer)
            sample = next(iter(per_layer[any_layer]["roles"].values()))[0][0]
            raise ModelError(f"{where} makes layer {layer} a MoE layer but the checkpoint has no expert tensors for "
                             f"it (layer {any_layer} has, e.g. {sample.name} in {sample.file})")


def _check_projections(layer: int, roles: dict[str, Any]) -> bool:
    """Whether the layer's experts fuse gate and up; raises when gate, up or down is missing."""
    fused = "gate_up" in roles
    if not fused and ("gate" in roles) != ("up" in roles):
        present = "gate" if "gate" in roles else "up"
        sample = roles[present][0][0]
        raise ModelError(f"{sample.file}: layer {layer} has expert {present} weights ({sample.name}) but no "
                         f"{'up' if present == 'gate' else 'gate'} weights")
    if "down" not in roles:
        sample = next(iter(roles.values()))[0][0]
        raise ModelError(f"{sample.file}: layer {layer} has expert weights ({sample.name}) but no down "
                         "projection")
    return fused


def _check_dtype(info: TensorInfo, label: str, layer: int, where: str) -> str:
    """The quant label to unpack the tensor with; raises when its dtype is not one the config's label allows."""
    allowed = _DTYPES_FOR.get(label, set())
    if info.dtype not in allowed and not (label == "fp8" and info.dtype in ("I32", "U32")):
        scheme = "no quantization" if label in ("bf16", "fp16") else f"{label} weights"
        raise ModelError(f"{info.file}: tensor {info.name} is {info.dtype} but {where} prescribes "
                         f"{scheme} for layer {layer}'s experts")
    return "int4" if label == "fp8" and info.dtype in ("I32", "U32") else label


def _weight_dims(info: TensorInfo, shape: tuple[int, ...], is_stacked: bool, experts: int,
                 where: str) -> tuple[int, ...]:
    """The two [N, K] dims of an expert weight (after a stacked tensor's expert dim), shape-checked."""
    if is_stacked:
        if len(shape) != 3:
            raise ModelError(f"{info.file}: stacked expert tensor {info.name} has shape "
                             f"{list(info.shape)}; expected [experts, N, K]")
        if shape[0] != experts:
            raise ModelError(f"{info.file}: tensor {info.name} stacks {shape[0]} experts but {where} "
                             f"says {experts} experts")
        return shape[1:]
    if len(shape) != 2:
        raise ModelError(f"{info.file}: expert tensor {info.name} has shape {list(info.shape)}; "
                         "expected a 2-D [N, K] weight")
    return shape


def _measure_layer(layer: int, roles: dict[str, Any], label: str, hidden: int, experts: int,
                   where: str) -> Iterator[tuple[int, int, TensorInfo, bool]]:
    """(hidden, intermediate, tensor, stacked) of each expert weight of one layer, checked one tensor at a time."""
    for role, items in roles.items():
        for info, blocks, expert in items:
            is_stacked = expert is None
            shape = _logical(info, _check_dtype(info, label, layer, where), blocks)
            dims = _weight_dims(info, shape, is_stacked, experts, where)
            h_dim, i_dim = _split_dims(info, dims, role, hidden, blocks or not is_stacked, where)
            if role == "gate_up":
                if i_dim % 2:
                    raise ModelError(f"{info.file}: fused gate-up tensor {info.name} {list(info.shape)} has an "
                                     f"odd width {i_dim}")
                i_dim //= 2
            yield h_dim, i_dim, info, is_stacked


def _same_size(stored: tuple[int, TensorInfo] | None, dim: int, info: TensorInfo,
               what: str) -> tuple[int, TensorInfo]:
    """The (size, first tensor) stored so far; raises when this tensor stores another ``what`` size."""
    if stored is None:
        return dim, info
    if stored[0] != dim:
        raise ModelError(f"{info.file}: tensor {info.name} {list(info.shape)} stores {what} {dim} "
                         f"but {stored[1].name} in {stored[1].file} stores {stored[0]}")
    return stored


def _check_expert_count(layer: int, entry: dict[str, Any], experts: int, where: str, complete: bool) -> None:
    """Raise when a layer's per-expert tensors name an expert past the config's count, or (``complete``) miss some."""
    if entry["experts"]:
        top = max(entry["experts"])
        if top >= experts:
            raise ModelError(f"layer {layer} has tensors for expert {top} but {where} says {experts} experts")
        if complete and len(entry["experts"]) != experts:
            sample = next(iter(entry["roles"].values()))[0][0]
            raise ModelError(f"{sample.file}: layer {layer} has tensors for {len(entry['experts'])} of the "
                             f"{experts} experts {where} declares")


def _measure_experts(
    per_layer: dict[int, dict[str, Any]], weight_label: dict[int, str], hidden: int, experts: int, where: str,
    complete: bool,
) -> tuple[tuple[int, TensorInfo], tuple[int, TensorInfo], bool, bool, set[str]]:
    """(stored intermediate, stored hidden, fused, stacked, dtypes) of every layer's experts, checked layer by layer."""
    stored_i: tuple[int, TensorInfo] | None = None
    stored_h: tuple[int, TensorInfo] | None = None
    fused = stacked_any = False
    dtypes: set[str] = set()
    for layer in sorted(per_layer):
        entry = per_layer[layer]
        fused = _check_projections(layer, entry["roles"]) or fused
        label = weight_label.get(layer, "bf16")
        for h_dim, i_dim, info, is_stacked in _measure_layer(layer, entry["roles"], label, hidden, experts, where):
            dtypes.add(info.dtype)
            stacked_any = stacked_any or is_stacked
            stored_i = _same_size(stored_i, i_dim, info, "intermediate")
            stored_h = _same_size(stored_h, h_dim, info, "hidden")
        _check_expert_count(layer, entry, experts, where, complete)
    assert stored_i is not None and stored_h is not None
    return stored_i, stored_h, fused, stacked_any, dtypes


def _check_stored_hidden(stored_h: tuple[int, TensorInfo], hidden: int, where: str) -> None:
    """Raise when the experts store another hidden size than the config's (it is never pre-padded)."""
    info = stored_h[1]
    if stored_h[0] < hidden:
        raise ModelError(f"{where} says hidden_size is {hidden} but {info.file}: tensor {info.name} "
                         f"{list(info.shape)} stores {stored_h[0]}")
    if stored_h[0] != hidden:
        raise ModelError(f"{where} says hidden_size is {hidden} but {info.file}: tensor {info.name} "
                         f"{list(info.shape)} stores {stored_h[0]}; expert weights keep the model's hidden size "
                         "(only the intermediate size can be pre-padded)")


def _prepad_note(stored_i: tuple[int, TensorInfo], intermediate: int, where: str) -> str:
    """The note for a stored intermediate larger than the config's; raises when it is no pre-padding of it."""
    multiple = prepad_multiple(intermediate, stored_i[0])
    if multiple is None:
        info = stored_i[1]
        hint = (f" ({stored_i[0] // intermediate}× the config: gate and up fused under one name, or another "
                "model's weights?)" if stored_i[0] % intermediate == 0 else "")
        raise ModelError(f"{where} says the expert intermediate size is {intermediate} but {info.file}: tensor "
                         f"{info.name} {list(info.shape)} stores {stored_i[0]}, which is no pre-padding of "
                         f"{intermediate} (a pre-pad rounds it up to a multiple of at most "
                         f"{PREPAD_MAX_MULTIPLE}: {_round_up(intermediate, PREPAD_MAX_MULTIPLE)} at most){hint}")
    return (f"checkpoint experts are pre-padded: intermediate stored as {stored_i[0]} "
            f"(config {intermediate}, +{stored_i[0] - intermediate}, rounded up to a multiple of "
            f"{multiple}); {stored_i[1].name}")


def _stored_size_notes(stored_i: tuple[int, TensorInfo], stored_h: tuple[int, TensorInfo], intermediate: int,
                       hidden: int, where: str) -> list[str]:
    """Notes on the stored expert sizes; raises when they are smaller than the config's or no pre-padding of it."""
    if stored_i[0] < intermediate:
        info = stored_i[1]
        raise ModelError(f"{where} says the expert intermediate size is {intermediate} but {info.file}: tensor "
                         f"{info.name} {list(info.shape)} stores {stored_i[0]}")
    _check_stored_hidden(stored_h, hidden, where)
    return [_prepad_note(stored_i, intermediate, where)] if stored_i[0] > intermediate else []


def analyse_experts(
    tensors: dict[str, TensorInfo], *, hidden: int, intermediate: int, experts: int, n_layers: int,
    moe_layers: Iterable[int], weight_label: dict[int, str], where: str, complete: bool = True,
) -> ExpertLayout | None:
    """Cross-check expert tensors with the config; None when no expert tensor is recognised.

    ``weight_label[i]`` is the weight quant label the config prescribes for layer i's experts; ``where`` names the
    config (for messages). Raises ModelError naming the tensor, its file and the config key on a mismatch.
    ``complete=False`` (some shards absent) skips the checks that need every tensor: layer coverage, expert count.
    """
    moe_set = set(moe_layers)
    per_layer, bias = _collect_experts(tensors, n_layers)
    if not per_layer:
        return None
    _check_coverage(per_layer, moe_set, where, complete)
    stored_i, stored_h, fused, stacked_any, dtypes = _measure_experts(per_layer, weight_label, hidden, experts,
                                                                      where, complete)
    notes = _stored_size_notes(stored_i, stored_h, intermediate, hidden, where)
    return ExpertLayout(stored_intermediate=stored_i[0], stored_hidden=stored_h[0], fused_gate_up=fused,
                        stacked=stacked_any, has_bias=bias, weight_dtypes=tuple(sorted(dtypes)),
                        moe_layers=tuple(sorted(per_layer)), notes=tuple(notes))


def expert_module_names(tensors: dict[str, TensorInfo], limit: int = 8) -> dict[int, tuple[str, ...]]:
    """Layer -> module names of its experts as the checkpoint spells them (first expert / stacked tensors), for
    matching quantization exclude patterns against real names."""
    out: dict[int, list[str]] = {}
    for name in tensors:
        m = _EXPERT_RE.match(name)
        if m is None or m.group("bias") or m.group("expert") not in (None, "0"):
            continue
        module = name[: m.end("proj")]
        names = out.setdefault(int(m.group("layer")), [])
        if module not in names and len(names) < limit:
            names.append(module)
    return {k: tuple(v) for k, v in out.items()}


def _split_dims(info: TensorInfo, dims: tuple[int, ...], role: str, hidden: int, linear_layout: bool,
                where: str) -> tuple[int, int]:
    """(hidden, intermediate-ish) from the two weight dims.

    Per-expert and blocks tensors use nn.Linear layout [out, in]: gate/up/gate_up are [I or 2I, H], down is
    [H, I]. Stacked bf16 tensors come as [E, H, 2I] / [E, I, H] (gpt-oss, Llama-4) or [E, 2I, H] / [E, H, I]
    (transformers v5 fused experts): the dim equal to hidden_size tells which.
    """
    a, b = dims
    if linear_layout:
        return (b, a) if role != "down" else (a, b)
    if a == hidden and b == hidden:
        return a, b
    if a == hidden:
        return a, b
    if b == hidden:
        return b, a
    raise ModelError(f"{info.file}: stacked expert tensor {info.name} {list(info.shape)} has no dimension equal to "
                     f"the hidden_size {hidden} of {where}")


# -- the local Hugging Face cache ------------------------------------------------------------------------------

_REPO_ID = re.compile(r"^(?:(?P<org>[A-Za-z0-9][A-Za-z0-9._-]{0,95})/)?(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,95})"
                      r"(?:@(?P<rev>[A-Za-z0-9][A-Za-z0-9._/-]{0,127}))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def is_repo_id(ref: str) -> bool:
    """``org/name`` (optionally ``@revision``): the shape of a Hugging Face model id."""
    m = _REPO_ID.match(ref)
    return bool(m and m.group("org") and ".." not in ref)


def hf_cache_dir(env: dict[str, str] | None = None) -> Path:
    """The hub cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
    ``~/.cache/huggingface/hub`` (huggingface_hub ``constants.py``; ``HUGGINGFACE_HUB_CACHE`` is the old name)."""
    env = os.environ if env is None else env
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return Path(env[var]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "huggingface" / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def resolve_hf_cache(ref: str) -> tuple[str, Path] | None:
    """(repo id, snapshot folder) for ``org/name[@revision]`` found in the local cache; None if not cached.

    Offline only: ``refs/{revision}`` (default ``main``) names the snapshot; a 40-hex revision names it directly.
    A repo with no refs file and exactly one snapshot uses that snapshot. Raises ModelError when the repo is in the
    cache but the revision or its snapshot is missing.
    """
    m = _REPO_ID.match(ref)
    if not m or not m.group("org"):
        return None
    org, name, rev = m.group("org"), m.group("name"), m.group("rev")
    repo_id = f"{org}/{name}"
    cache = hf_cache_dir()
    repo_dir = cache / f"models--{org}--{name}"
    st = safe_stat(repo_dir, "HF cache repo folder")
    if st is None or not os.path.isdir(repo_dir):
        return None
    snapshots = repo_dir / "snapshots"
    revision = rev or "main"
    if _COMMIT.match(revision):
        commit = revision
    else:
        ref_file = repo_dir / "refs" / revision
        if safe_stat(ref_file, "HF cache ref") is not None:
            try:
                commit = ref_file.read_text(encoding="utf-8", errors="replace").strip()
            except OSError as exc:
                raise ModelError(f"{ref_file}: cannot read: {exc.strerror or exc}") from None
            if not _COMMIT.match(commit):
                raise ModelError(f"{ref_file}: expected a 40-hex commit hash, got {_short(commit[:60])}")
        else:
            try:
                snaps = sorted(p.name for p in snapshots.iterdir()) if os.path.isdir(snapshots) else []
            except OSError:
                snaps = []
            if rev is None and len(snaps) == 1:
                commit = snaps[0]
            else:
                raise ModelError(f"{repo_id}: the local HF cache ({repo_dir}) has no refs/{revision} "
                                 f"(snapshots: {', '.join(snaps) or 'none'}); pass a commit with {repo_id}@<commit>")
    snap = snapshots / commit
    if safe_stat(snap, "HF cache snapshot") is None or not os.path.isdir(snap):
        raise ModelError(f"{repo_id}: refs/{revision} points at snapshot {commit} which is not in the local HF "
                         f"cache ({snapshots})")
    return (repo_id if rev is None else f"{repo_id}@{rev}"), snap
