"""Read capability_db/ (TOML/JSON shipped in the wheel) and build simulated targets from it.

Loading is lazy and cached; a broken file raises :class:`CapabilityDBError` naming file, key and problem.
"""

from __future__ import annotations

import json
import re
import sys
import importlib
import os
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from moedispatch._util.caches import memoize
from moedispatch.core.aiter_release import in_range, range_problem, release_of
from moedispatch.core.capabilities import Capabilities
from moedispatch.core.errors import CapabilityDBError, TargetError
from moedispatch._util.suggest import did_you_mean

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "load_toml",
    "load_json",
    "load_db_json",
    "list_model_files",
    "gpus",
    "aiter_db",
    "normalize_gfx",
    "resolve_target",
    "features_for_version",
    "default_aiter_version",
    "target_capabilities",
    "arch_facts",
    "product_peaks",
    "feature_info",
    "CONFIDENCES",
]

_PACKAGE = "moedispatch.capability_db"


@memoize(maxsize=None)
def _package_dir(package: str) -> str:
    # The data ships as plain files inside the installed package (wheel or editable), so reading them from the
    # package's folder is enough; importlib.resources would add ~6 ms to explain's start-up.
    module = importlib.import_module(package)
    return os.path.dirname(os.path.abspath(module.__file__ or ""))


def _read(package: str, name: str) -> bytes:
    try:
        with open(os.path.join(_package_dir(package), name), "rb") as fh:
            return fh.read()
    except (FileNotFoundError, ImportError):
        raise CapabilityDBError(f"capability_db/{name}: file missing from the installation") from None


@memoize(maxsize=None)
def load_toml(name: str) -> dict[str, Any]:
    """A capability_db TOML file, parsed; every ``*confidence`` value in it (at any depth) is checked at load."""
    raw = _read(_PACKAGE, name)
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CapabilityDBError(f"capability_db/{name}: not valid TOML: {exc}") from None
    _check_confidences(doc, f"capability_db/{name}", "")
    return doc


def _check_confidences(node: Any, where: str, path: str) -> None:
    """Every key named ``confidence`` or ``*_confidence`` must be one of CONFIDENCES (error names file and key)."""
    if isinstance(node, dict):
        for key, value in node.items():
            at = f"{path}.{key}" if path else key
            if (key == "confidence" or key.endswith("_confidence")) and not isinstance(value, dict):
                if value not in CONFIDENCES:
                    raise CapabilityDBError(f"{where}: {at} = {value!r:.60} not one of {', '.join(CONFIDENCES)}")
            else:
                _check_confidences(value, where, at)
    elif isinstance(node, list):
        for n, item in enumerate(node):
            _check_confidences(item, where, f"{path}[{n}]")


@memoize(maxsize=None)
@memoize(maxsize=None)
def load_db_json(name: str) -> Any:
    """A JSON file of capability_db by its path there (``engines/options.json``), parsed once per process."""
    raw = _read(_PACKAGE, name)
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CapabilityDBError(f"capability_db/{name}: not valid JSON: {exc}") from None


def load_json(name: str) -> Any:
    package, _, leaf = name.rpartition("/")
    pkg = _PACKAGE + ("." + package.replace("/", ".") if package else "")
    raw = _read(pkg, leaf)
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CapabilityDBError(f"capability_db/{name}: not valid JSON: {exc}") from None


@memoize(maxsize=None)
def list_model_files() -> tuple[str, ...]:
    root = _package_dir(_PACKAGE + ".models")
    return tuple(sorted(n for n in os.listdir(root) if n.endswith(".json")))


# -- GPUs ------------------------------------------------------------------------------------------------------

def _type_name(value: Any) -> str:
    return {str: "a string", int: "an integer", bool: "a boolean", float: "a number", list: "an array",
            dict: "a table"}.get(type(value), type(value).__name__)


def _need(value: Any, types: type | tuple[type, ...], where: str, key: str, what: str) -> Any:
    """``value`` if it has one of ``types`` (bool is not an int here), else CapabilityDBError naming file/key."""
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in (
        types if isinstance(types, tuple) else (types,)))
    if not ok:
        raise CapabilityDBError(f"{where}: {key} must be {what}, got {_type_name(value)} {value!r:.60}")
    return value


def _table(data: Any, key: str, where: str) -> dict[str, Any]:
    if key not in data:
        raise CapabilityDBError(f"{where}: missing table [{key}]")
    return _need(data[key], dict, where, f"[{key}]", "a table")


#: How sure a capability_db fact is (key ``confidence``, default "confirmed"): read in the cited primary source,
#: inferred by us from it, or found in no primary source.
CONFIDENCES = ("confirmed", "derived", "unconfirmed")


def _confidence(entry: dict[str, Any], where: str) -> str:
    """The entry's ``confidence`` (default "confirmed"); anything else than CONFIDENCES raises CapabilityDBError."""
    value = entry.get("confidence", "confirmed")
    if value not in CONFIDENCES:
        raise CapabilityDBError(f"{where}: confidence {value!r:.60} not one of {', '.join(CONFIDENCES)}")
    return value


def _str_list(value: Any, where: str, key: str) -> list[str]:
    _need(value, list, where, key, "an array of strings")
    for item in value:
        _need(item, str, where, key, "an array of strings")
    return value


@memoize(maxsize=None)
def gpus() -> dict[str, Any]:
    """gpus.toml, checked at load: a broken entry raises CapabilityDBError naming file, key and problem."""
    where = "capability_db/gpus.toml"
    data = load_toml("gpus.toml")
    default = _table(data, "default", where)
    arch = _table(data, "arch", where)
    if not arch:
        raise CapabilityDBError(f"{where}: [arch] lists no GPU arch")
    for gfx, entry in arch.items():
        at = f"{where}: [arch.{gfx}]"
        _need(entry, dict, where, f"[arch.{gfx}]", "a table")
        for req in ("family", "cdna", "fp8", "native_mx", "source", "products"):
            if req not in entry:
                raise CapabilityDBError(f"{at} lacks key {req!r}")
        _need(entry["family"], str, at, "family", "a string")
        _need(entry["cdna"], int, at, "cdna", "an integer")
        _need(entry["fp8"], str, at, "fp8", "a string (\"\" for none)")
        _need(entry["native_mx"], bool, at, "native_mx", "a boolean")
        _need(entry["source"], str, at, "source", "a string")
        _confidence(entry, at)
        if "partitions_confidence" in entry:
            _confidence({"confidence": entry["partitions_confidence"]}, f"{at} partitions_confidence")
        products = _need(entry["products"], list, at, "products", "a non-empty array of tables")
        if not products:
            raise CapabilityDBError(f"{at}: products must be a non-empty array of tables")
        for n, product in enumerate(products):
            pwhere = f"{at} products[{n}]"
            _need(product, dict, at, f"products[{n}]", "a table")
            for req in ("name", "compute_units"):
                if req not in product:
                    raise CapabilityDBError(f"{pwhere} lacks key {req!r}")
            _need(product["name"], str, pwhere, "name", "a string")
            if _need(product["compute_units"], int, pwhere, "compute_units", "a positive integer") <= 0:
                raise CapabilityDBError(f"{pwhere}: compute_units must be a positive integer, "
                                        f"got {product['compute_units']}")
            if "device_ids" in product:
                _str_list(product["device_ids"], pwhere, "device_ids")
            for table in ([entry["partitions"]] if "partitions" in entry else []) + (
                    [product["partitions"]] if "partitions" in product else []):
                _need(table, dict, pwhere, "partitions", "a table of mode = device count")
                for mode, n in table.items():
                    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                        raise CapabilityDBError(f"{pwhere}: partitions.{mode} must be a positive integer, got {n!r}")
    aliases = _need(data.get("aliases", {}), dict, where, "[aliases]", "a table")
    for alias, target in aliases.items():
        _need(target, str, where, f"aliases.{alias}", "a string")
        if target not in arch:
            raise CapabilityDBError(f"{where}: aliases.{alias} = {target!r} is not an [arch.*] entry")
    if "gfx" not in default:
        raise CapabilityDBError(f"{where}: [default] lacks key 'gfx'")
    if _need(default["gfx"], str, where, "default.gfx", "a string") not in arch:
        raise CapabilityDBError(f"{where}: default.gfx = {default['gfx']!r} is not an [arch.*] entry")
    if "product" in default:
        names = [p["name"] for p in arch[default["gfx"]]["products"]]
        if _need(default["product"], str, where, "default.product", "a string") not in names:
            raise CapabilityDBError(f"{where}: default.product = {default['product']!r} is not a product of "
                                    f"[arch.{default['gfx']}] ({', '.join(names)})")
    _check_peaks(data, arch, where)
    return data


_PEAK_NUMBERS = ("hbm_tbps", "bf16_tflops", "fp8_tflops", "fp4_tflops", "measured_hbm_tbps", "measured_fp8_tflops")
_CONFIDENCE = ("confirmed", "derived", "unconfirmed")


def _check_peaks(data: dict[str, Any], arch: dict[str, Any], where: str) -> None:
    """``[peak.<product>]`` (cost model): positive numbers, a source and a confidence, a product that exists."""
    peaks = _need(data.get("peak", {}), dict, where, "[peak]", "a table")
    products = {p["name"] for entry in arch.values() for p in entry["products"]}
    for name, peak in peaks.items():
        at = f"{where}: [peak.{name}]"
        _need(peak, dict, where, f"[peak.{name}]", "a table")
        if name not in products:
            raise CapabilityDBError(f"{at}: {name!r} is not a product of any [arch.*]")
        for req in ("hbm_tbps", "bf16_tflops", "source", "confidence"):
            if req not in peak:
                raise CapabilityDBError(f"{at} lacks key {req!r}")
        for key in _PEAK_NUMBERS:
            if key in peak and _need(peak[key], (int, float), at, key, "a positive number") <= 0:
                raise CapabilityDBError(f"{at}: {key} must be a positive number, got {peak[key]!r}")
        for key in ("confidence", "measured_confidence"):
            if key in peak and peak[key] not in _CONFIDENCE:
                raise CapabilityDBError(f"{at}: {key} must be one of {', '.join(_CONFIDENCE)}, got {peak[key]!r}")
        _need(peak["source"], str, at, "source", "a string")
        if any(k.startswith("measured_") and k not in ("measured_source", "measured_confidence") for k in peak) \
                and "measured_source" not in peak:
            raise CapabilityDBError(f"{at}: measured_* figures need a measured_source")


def product_peaks(product: str | None) -> dict[str, Any] | None:
    """gpus.toml ``[peak.<product>]`` (dense peaks and measured ceilings, with sources), or None if not listed."""
    if not product:
        return None
    return gpus().get("peak", {}).get(product)


_TARGET_SUFFIX = re.compile(r":(sramecc|xnack)[+-]", re.IGNORECASE)


def normalize_gfx(name: str) -> str:
    """``gfx942:sramecc+:xnack-`` → ``gfx942``; retired gfx940/941 → gfx942 (gpus.toml [aliases])."""
    base = _TARGET_SUFFIX.sub("", name.strip()).split(":")[0].lower()
    if base.startswith("amdgcn-amd-amdhsa--"):
        base = base[len("amdgcn-amd-amdhsa--"):]
    return gpus().get("aliases", {}).get(base, base)


def arch_facts(gfx: str) -> dict[str, Any] | None:
    return gpus()["arch"].get(gfx)


def _product_index() -> dict[str, tuple[str, dict[str, Any]]]:
    index: dict[str, tuple[str, dict[str, Any]]] = {}
    for gfx, entry in gpus()["arch"].items():
        for product in entry["products"]:
            key = re.sub(r"[\s_-]", "", product["name"].lower())
            index[key] = (gfx, product)
    return index


def partitions_for(gfx: str, product: str | None = None) -> dict[str, int]:
    """Compute-partition modes of a product → how many devices each splits it into (``{"SPX": 1, …, "CPX": 8}``).

    A product's own ``partitions`` (gpus.toml) wins over its arch's; a mode whose divisor does not divide the
    product's CU count is left out (each partition exposes whole XCDs). ``{}``: the product cannot be partitioned.
    """
    entry = arch_facts(gfx) or {}
    modes: dict[str, int] = dict(entry.get("partitions", {}))
    full = None
    for p in entry.get("products", []):
        if p["name"] == (product or entry["products"][0]["name"]):
            modes = dict(p.get("partitions", modes))
            full = p["compute_units"]
    if full is None:
        return {}
    return {mode.upper(): n for mode, n in sorted(modes.items(), key=lambda kv: kv[1]) if n >= 1 and full % n == 0}


def partition_of(gfx: str | None, product: str | None, compute_units: int | None) -> str | None:
    """The compute-partition mode a (gfx, product, CU count) is in (``"CPX"`` for an MI355X with 32 CUs), or
    ``None`` for the whole device or a count no mode of the product gives."""
    if not gfx or not product or not compute_units:
        return None
    entry = arch_facts(gfx) or {}
    full = next((p["compute_units"] for p in entry.get("products", []) if p["name"] == product), None)
    if full is None or compute_units == full:
        return None
    return next((mode for mode, n in partitions_for(gfx, product).items() if n > 1 and full // n == compute_units),
                None)


def target_entry(caps: Any) -> dict[str, Any]:
    """The explain JSON ``target`` object: ``Capabilities.target_dict()`` plus ``partition`` (``"CPX"``) when the
    target is one compute partition of its product (the key is absent for a whole device)."""
    entry = caps.target_dict()
    mode = partition_of(caps.gfx, caps.product, caps.compute_units)
    if mode:
        entry["partition"] = mode
    return entry


def target_label(caps: Any) -> str:
    """``gfx950 (MI355X CPX)`` for a partitioned target, else ``Capabilities.arch_label``."""
    mode = partition_of(caps.gfx, caps.product, caps.compute_units)
    if mode and caps.product:
        return f"{caps.gfx} ({caps.product} {mode})"
    return caps.arch_label


def target_spec(caps: Any) -> str | None:
    """The ``--target`` spelling that rebuilds ``caps``'s GPU (``MI355X:CPX``, ``MI300X``, ``gfx950``)."""
    name = caps.product or caps.gfx
    mode = partition_of(caps.gfx, caps.product, caps.compute_units)
    return f"{name}:{mode}" if name and mode else name


#: ``PRODUCT:MODE`` (primary) or ``PRODUCT-MODE``; a gfx name's ``:sramecc±``/``:xnack±`` suffixes are not modes.
_PARTITION_SUFFIX = re.compile(r"^(?P<base>.+?)\s*[:\-\s]\s*(?P<mode>[a-z]{2,4})$", re.IGNORECASE)


def _all_modes() -> list[str]:
    modes: set[str] = set()
    for entry in gpus()["arch"].values():
        modes.update(m.upper() for m in entry.get("partitions", {}))
        for p in entry["products"]:
            modes.update(m.upper() for m in p.get("partitions", {}))
    return sorted(modes)


def resolve_target(target: str) -> tuple[str, str | None, int | None]:
    """A gfx name or product name (case-insensitive, ``MI300X``, ``mi355x``, ``gfx950``), optionally with a compute
    partition (``MI355X:CPX``) → (gfx, product, CUs); a partition's CUs are the product's divided by the mode's
    device count (:func:`resolve_partitioned_target` also returns the mode).

    A gfx name maps to its first (flagship) product. Unknown names raise :class:`TargetError` listing the known ones.
    """
    gfx, product, cus, _ = resolve_partitioned_target(target)
    return gfx, product, cus


def resolve_partitioned_target(target: str) -> tuple[str, str | None, int | None, str | None]:
    """:func:`resolve_target` plus the partition mode (``"CPX"``; ``None`` without one, ``"SPX"`` when asked)."""
    if not isinstance(target, str) or not target.strip():
        raise TargetError("--target must be a gfx name (gfx942, gfx950) or a product (MI300X, MI355X), "
                          "optionally with a compute partition (MI355X:CPX)")
    text = target.strip()
    base, mode = text, None
    stripped = _TARGET_SUFFIX.sub("", text)
    m = _PARTITION_SUFFIX.match(stripped)
    if m:
        sep = stripped[len(m.group("base")):].strip()[:1]
        # After ``:`` any word is a mode (an unknown one is an error); after a dash or a space only a known mode
        # (a product name may end in letters: ``RX 7900 XTX``).
        if sep == ":" or m.group("mode").upper() in _all_modes():
            base, mode = m.group("base"), m.group("mode").upper()
    gfx, product, cus = _resolve_base(base)
    if mode is None:
        return gfx, product, cus, None
    modes = partitions_for(gfx, product)
    if mode not in modes:
        listing = ", ".join(f"{k} ({cus // n} CUs)" for k, n in modes.items())
        raise TargetError(f"unknown compute partition {mode!r} for {product or gfx}{did_you_mean(mode, modes)}; "
                          + (f"modes: {listing}" if modes else f"{product or gfx} has no compute partition modes "
                             "in capability_db/gpus.toml"))
    return gfx, product, (cus // modes[mode] if cus else cus), mode


def _resolve_base(text: str) -> tuple[str, str | None, int | None]:
    arch = gpus()["arch"]
    if text.lower().startswith(("gfx", "amdgcn")):
        gfx = normalize_gfx(text)
        if gfx not in arch:
            raise TargetError(f"unknown GPU arch {text!r}{did_you_mean(text, arch)}; known: {', '.join(sorted(arch))}")
        product = arch[gfx]["products"][0]
        return gfx, product["name"], product["compute_units"]
    key = re.sub(r"[\s_-]", "", text.lower())
    found = _product_index().get(key)
    if found is None:
        names = sorted(p["name"] for e in arch.values() for p in e["products"])
        raise TargetError(f"unknown target {text!r}{did_you_mean(text, [*arch, *names])}; use a gfx name ({', '.join(sorted(arch))}) or a product "
                          f"({', '.join(names)}), optionally with a compute partition (MI355X:CPX)")
    gfx, product = found
    return gfx, product["name"], product["compute_units"]


def product_for(gfx: str, compute_units: int | None = None, device_id: str | None = None) -> str | None:
    """Best product name for a probed GPU: by PCI device id, else by CU count, else the arch's first product."""
    entry = arch_facts(gfx)
    if entry is None:
        return None
    if device_id:
        for product in entry["products"]:
            if device_id.lower() in [d.lower() for d in product.get("device_ids", [])]:
                return product["name"]
    if compute_units is not None:
        for product in entry["products"]:
            if product["compute_units"] == compute_units:
                return product["name"]
        return None
    return entry["products"][0]["name"]


# -- AITER -----------------------------------------------------------------------------------------------------

def _pep440(text: Any, where: str, key: str) -> Version:
    _need(text, str, where, key, "a PEP 440 version string")
    try:
        return Version(text)
    except InvalidVersion:
        raise CapabilityDBError(f"{where}: {key} = {text!r} is not a PEP 440 version") from None


def _specifier(text: Any, where: str, key: str) -> SpecifierSet:
    _need(text, str, where, key, "a PEP 440 specifier string")
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise CapabilityDBError(f"{where}: {key} = {text!r} is not a PEP 440 specifier") from None


@memoize(maxsize=None)
def aiter_db() -> dict[str, Any]:
    """aiter.toml, checked at load: a broken entry raises CapabilityDBError naming file, key and problem."""
    where = "capability_db/aiter.toml"
    data = load_toml("aiter.toml")
    if "known_versions" not in data or "features" not in data:
        raise CapabilityDBError(f"{where}: needs known_versions and [features.*]")
    versions = _need(data["known_versions"], list, where, "known_versions", "a non-empty array of versions")
    if not versions:
        raise CapabilityDBError(f"{where}: known_versions must be a non-empty array of versions")
    for n, text in enumerate(versions):
        _pep440(text, where, f"known_versions[{n}]")
    _need(data["features"], dict, where, "[features]", "a table")
    for name, feat in data["features"].items():
        fwhere = f"{where}: [features.{name}]"
        _need(feat, dict, where, f"[features.{name}]", "a table")
        for req in ("since", "what", "source"):
            if req not in feat:
                raise CapabilityDBError(f"{fwhere} lacks key {req!r}")
        _need(feat["what"], str, fwhere, "what", "a string")
        _need(feat["source"], str, fwhere, "source", "a string")
        _confidence(feat, fwhere)
        for opt in ("short", "cite"):
            if opt in feat:
                _need(feat[opt], str, fwhere, opt, "a string")
        if not isinstance(feat["since"], str):
            _need(feat["since"], str, fwhere, "since", "a PEP 440 version string")
        try:
            Version(feat["since"])
        except InvalidVersion:
            raise CapabilityDBError(f"{fwhere} since={feat['since']!r} is not a PEP 440 version") from None
        for n, text in enumerate(_str_list(feat.get("absent_in", []), fwhere, "absent_in")):
            _pep440(text, fwhere, f"absent_in[{n}]")
    pins = _need(data.get("flydsl_pins", []), list, where, "flydsl_pins", "an array of tables")
    for n, pin in enumerate(pins):
        pwhere = f"{where}: flydsl_pins[{n}]"
        _need(pin, dict, where, f"flydsl_pins[{n}]", "a table")
        for req in ("aiter", "flydsl", "source"):
            if req not in pin:
                raise CapabilityDBError(f"{pwhere} lacks key {req!r}")
        _specifier(pin["aiter"], pwhere, "aiter")
        if range_problem(pin["aiter"]):
            raise CapabilityDBError(f"{pwhere}: aiter = {pin['aiter']!r} is not a release range: "
                                    f"{range_problem(pin['aiter'])}")
        _specifier(pin["flydsl"], pwhere, "flydsl")
        _need(pin["source"], str, pwhere, "source", "a string")
        _confidence(pin, pwhere)
    return data


def parse_aiter_version(text: str) -> Version:
    try:
        return Version(text.strip())
    except (ValueError, AttributeError):   # InvalidVersion, or a release number over Python's int-digits limit
        raise TargetError(f"--aiter-version {text!r:.80} is not a PEP 440 version (e.g. 0.1.15.post3, "
                          "0.1.21.post2+rocm7.1); use 'none' for no AITER") from None


def features_for_version(version: str) -> frozenset[str]:
    """Feature names whose ``since`` floor this version meets (local labels like ``+rocm7.1`` ignored)."""
    release = release_of(str(parse_aiter_version(version)))   # 0.1.19rc2 → 0.1.19, as every release range
    return frozenset(
        name for name, feat in aiter_db()["features"].items()
        if release >= Version(feat["since"]) and str(release) not in feat.get("absent_in", [])
    )


def default_aiter_version() -> str:
    return max(aiter_db()["known_versions"], key=Version)


def feature_info(name: str) -> dict[str, Any]:
    """The [features.NAME] table of aiter.toml, with ``confidence`` filled in ("confirmed" when the file omits it)."""
    try:
        feat = aiter_db()["features"][name]
    except KeyError:
        raise CapabilityDBError(f"capability_db/aiter.toml: no [features.{name}] (a backend rule needs it)") from None
    return {**feat, "confidence": feat.get("confidence", "confirmed")}


@memoize(maxsize=256)
def flydsl_pin(aiter_version: str) -> tuple[str, str] | None:
    version = str(parse_aiter_version(aiter_version))
    for pin in aiter_db().get("flydsl_pins", []):
        if in_range(version, pin["aiter"]):          # checked at load (aiter_db)
            return pin["flydsl"], pin["source"]
    return None


# -- simulated targets -----------------------------------------------------------------------------------------

def _arch_name_notes(target: str, gfx: str, product: str | None, cus: int | None) -> list[str]:
    """A target named by arch (``gfx942``) where the arch's products differ in CU count (newcomer minor 25): which
    product was assumed, and the others. AITER's tuned fused-MoE rows are keyed on the CU count (cu_num;
    ROCm/aiter@v0.1.15.post3:aiter/jit/utils/chip_info.py get_cu_num), so MI308X (80 CUs) looks up other rows."""
    if not target.strip().lower().startswith(("gfx", "amdgcn")):
        return []
    others = [p for p in (arch_facts(gfx) or {}).get("products", []) if p["name"] != product]
    if not any(p["compute_units"] != cus for p in others):
        return []
    listing = ", ".join(f"{p['name']} ({p['compute_units']} CUs)" for p in others)
    return [f"target {target.strip()} names an arch, not a product: planned for {product} ({cus} CUs), the arch's "
            f"first product; {gfx} is also {listing}, and AITER keys its tuned rows on the CU count (cu_num: "
            "ROCm/aiter@v0.1.15.post3:aiter/jit/utils/chip_info.py get_cu_num): name the product (e.g. "
            f"{others[-1]['name']}) to plan for another"]


def target_capabilities(
    target: str | None = None,
    aiter_version: str | None = None,
    *,
    target_source: str = "flag",
    aiter_source: str = "flag",
) -> Capabilities:
    """Capabilities of a simulated target built from capability_db (no probing, no imports of GPU libraries).

    ``target=None`` uses the DB default target; ``aiter_version=None`` the newest AITER the DB knows;
    ``aiter_version="none"`` means AITER is not installed.
    """
    provenance: list[tuple[str, str]] = []
    notes: list[str] = []
    if target is None:
        default = gpus()["default"]
        gfx, product, cus = resolve_target(default.get("product") or default["gfx"])
        source = "default"
        provenance += [("gfx", "default"), ("product", "default"), ("compute_units", "db")]
    else:
        gfx, product, cus, mode = resolve_partitioned_target(target)
        source = target_source
        provenance += [("gfx", target_source), ("product", target_source if not target.lower().startswith("gfx")
                                                  else "db"), ("compute_units", "db")]
        if mode is not None:
            provenance.append(("partition", target_source))
        notes += _arch_name_notes(target, gfx, product, cus)
    facts = arch_facts(gfx) or {}
    provenance += [("fp8_format", "db"), ("native_mx", "db")]
    if aiter_version is None:
        version: str | None = default_aiter_version()
        provenance.append(("aiter_version", "default"))
    elif aiter_version.strip().lower() in ("none", "absent", "no"):
        version = None
        provenance.append(("aiter_version", aiter_source))
    else:
        version = str(parse_aiter_version(aiter_version))
        provenance.append(("aiter_version", aiter_source))
        public = release_of(version)
        known = sorted(Version(v) for v in aiter_db()["known_versions"])
        if public not in known:
            if public < known[0]:  # no floor below the oldest: say what is assumed instead
                notes.append(f"AITER {version} is older than every release capability_db/aiter.toml's kernel-feature "
                             f"table covers (oldest {known[0]}): every feature whose floor is later is assumed absent "
                             "(the tuned rows and dispatch rules are the AITER index's own, read per release)")
            else:
                notes.append(
                    f"AITER {version} is not in capability_db/aiter.toml; features assumed from the nearest floor"
                    + (f" (newer than the newest known, {known[-1]})" if public > known[-1] else "")
                )
    features = features_for_version(version) if version else frozenset()
    if version:
        provenance.append(("aiter_features", "db"))
    unknown = () if version else (("aiter_version", "AITER not installed on the target (--aiter-version none)"),)
    return Capabilities(
        gfx=gfx,
        product=product,
        compute_units=cus,
        family=facts.get("family"),
        cdna=int(facts.get("cdna", 0)),
        fp8_format=facts.get("fp8") or None,
        native_mx=bool(facts.get("native_mx", False)),
        aiter_version=version,
        aiter_features=features,
        provenance=tuple(provenance),
        unknown=unknown,
        source=source,
        notes=tuple(notes),
    )
