"""Boundary cases of the plugin registry (moedispatch/selector/plugins.py), each pinning a rule the sampled
mutation run found unpinned: the allow/deny env lists and what they report, entry-point discovery from dist-info
folders, backend validation, deadlines and ownership of third-party plugins. All in-process."""

from __future__ import annotations

import logging
import sys
import threading
import zipfile
from types import SimpleNamespace

import pytest

from moedispatch import Backend, Verdict, hookimpl
from moedispatch._util import deadline
from moedispatch.core.errors import PluginError, UsageError
from moedispatch.selector import plugins as mp
from moedispatch.selector.plugins import PluginRecord, build_registry, plugin_manager_for

BUILTIN_EPS = ["aiter-asm", "aiter-ck", "aiter-cktile", "aiter-flydsl", "aiter-triton", "emulation", "triton"]


class Fixed(Backend):
    def __init__(self, name, preference=1):
        self.name, self.preference = name, preference

    def check(self, layer, caps):
        return Verdict(True, ("fine",))


def plugin(*backends):
    class P:
        @hookimpl
        def register_backends(self):
            return list(backends)
    return P()


def _record(reg, name):
    return next(p for p in reg.plugins if p.name == name)


# -- MOEDISPATCH_PLUGIN_TIMEOUT ------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", ["0", "-1", "inf", "nan", "ten"])
def test_plugin_timeout_env_must_be_a_positive_finite_number(monkeypatch, raw):
    """_check_timeout_env: MOEDISPATCH_PLUGIN_TIMEOUT is a positive, finite number of seconds, never silently 10."""
    monkeypatch.setenv("MOEDISPATCH_PLUGIN_TIMEOUT", raw)
    with pytest.raises(UsageError) as exc:
        build_registry(load_entrypoints=False)
    assert str(exc.value) == (f"MOEDISPATCH_PLUGIN_TIMEOUT={raw!r}: expected a positive, finite number of seconds "
                              f"(default {mp.DEFAULT_PLUGIN_TIMEOUT_S:g})")


@pytest.mark.parametrize("raw", ["2.5", "1", " "])
def test_plugin_timeout_env_accepts_seconds_or_blank(monkeypatch, raw):
    """_check_timeout_env: any positive finite number (or a blank value: the default) is accepted."""
    monkeypatch.setenv("MOEDISPATCH_PLUGIN_TIMEOUT", raw)
    assert build_registry([("p", plugin(Fixed("a")))], load_entrypoints=False).names() == ("a",)


# -- allow and deny lists ------------------------------------------------------------------------------------------

def test_allow_list_naming_nothing_reports_what_is_known(monkeypatch):
    """MOEDISPATCH_LOAD_PLUGINS that matches no plugin: one error record naming every known entry point."""
    monkeypatch.setenv("MOEDISPATCH_LOAD_PLUGINS", "bogus, tritn")
    reg = build_registry()
    assert reg.names() == ()
    rec = _record(reg, "MOEDISPATCH_LOAD_PLUGINS")
    assert rec == PluginRecord("MOEDISPATCH_LOAD_PLUGINS", None, None, (), (), (
        "MOEDISPATCH_LOAD_PLUGINS='bogus, tritn' matches no plugin or backend: bogus, tritn "
        f"(known: {', '.join(BUILTIN_EPS)})",), False)


def test_an_empty_allow_list_says_so_and_a_matching_one_is_silent(monkeypatch):
    """MOEDISPATCH_LOAD_PLUGINS: empty loads none and says so; a list that matches reports nothing."""
    monkeypatch.setenv("MOEDISPATCH_LOAD_PLUGINS", "")
    reg = build_registry(load_entrypoints=False)
    assert reg.errors == ("MOEDISPATCH_LOAD_PLUGINS: MOEDISPATCH_LOAD_PLUGINS='' is empty: no plugins loaded "
                          "(known: none)",)
    monkeypatch.setenv("MOEDISPATCH_LOAD_PLUGINS", "emulation,aiter-ck")
    reg = build_registry()
    assert set(reg.names()) == {"emulation", "aiter-ck"} and reg.errors == ()


def test_allow_list_may_name_an_inline_plugin_or_its_backend(monkeypatch):
    """MOEDISPATCH_LOAD_PLUGINS may name backends too: an inline plugin's backend is kept by its name."""
    monkeypatch.setenv("MOEDISPATCH_LOAD_PLUGINS", "b")
    reg = build_registry([("acme", plugin(Fixed("a"), Fixed("b")))], load_entrypoints=False)
    assert reg.names() == ("b",) and reg.errors == ()


def test_deny_list_with_a_typo_says_what_it_meant(monkeypatch):
    """MOEDISPATCH_DISABLE_PLUGINS naming no installed plugin: a record with a did-you-mean hint and the list."""
    monkeypatch.setenv("MOEDISPATCH_DISABLE_PLUGINS", "tritn,emulation,zzz")
    reg = build_registry([("acme", plugin(Fixed("a")))])
    assert "emulation" not in reg.names() and "triton" in reg.names() and "a" in reg.names()
    rec = _record(reg, "MOEDISPATCH_DISABLE_PLUGINS")
    known = sorted(BUILTIN_EPS + ["acme"])
    assert rec == PluginRecord("MOEDISPATCH_DISABLE_PLUGINS", None, None, (), (), (
        f"names no installed plugin: 'tritn' (did you mean 'triton'?), 'zzz' — nothing was disabled for it "
        f"(installed: {', '.join(known)})",), False)


def test_deny_list_without_entry_points_knows_only_inline_plugins(monkeypatch):
    """MOEDISPATCH_DISABLE_PLUGINS with load_entrypoints=False: only the inline plugins are installed."""
    monkeypatch.setenv("MOEDISPATCH_DISABLE_PLUGINS", "nothing")
    reg = build_registry(load_entrypoints=False)
    assert reg.errors == ("MOEDISPATCH_DISABLE_PLUGINS: names no installed plugin: 'nothing' — nothing was "
                          "disabled for it (installed: none)",)


def test_a_denied_inline_plugin_does_not_stop_the_next(monkeypatch):
    """MOEDISPATCH_DISABLE_PLUGINS: a denied inline plugin is skipped; the plugins after it still load."""
    monkeypatch.setenv("MOEDISPATCH_DISABLE_PLUGINS", "first")
    reg = build_registry([("first", plugin(Fixed("a"))), ("second", plugin(Fixed("b")))], load_entrypoints=False)
    assert reg.names() == ("b",) and reg.errors == ()


def test_a_denied_backend_does_not_drop_its_siblings(monkeypatch):
    """MOEDISPATCH_DISABLE_PLUGINS may name a backend: only that backend of its plugin is left out."""
    monkeypatch.setenv("MOEDISPATCH_DISABLE_PLUGINS", "a,acme-x")
    reg = build_registry([("acme", plugin(Fixed("a"), Fixed("b"))), ("acme-x", plugin())], load_entrypoints=False)
    assert reg.names() == ("b",) and _record(reg, "acme").backends == ("b",)


# -- records, owners, validation -----------------------------------------------------------------------------------

def test_registry_records_owners_and_strictness():
    """Registry: which plugin registered each backend (also for the deadline machinery), and strict as asked."""
    a, b = Fixed("a"), Fixed("b")
    reg = build_registry([("acme", plugin(a)), ("beta", plugin(b))], load_entrypoints=False)
    assert reg.owner("a") == "acme" and reg.owner("b") == "beta" and reg.owner("zzz") is None
    assert deadline.owner_name(a) == "acme" and deadline.owner_name(b) == "beta"
    assert reg.strict is False and build_registry(load_entrypoints=False, strict=True).strict is True
    assert plugin_manager_for(a) is reg.pm and plugin_manager_for(Fixed("a")) is None


def test_plugin_record_to_dict():
    """PluginRecord.to_dict: the `backends --format json` entry; warnings only when there are some."""
    rec = PluginRecord("acme", "acme-moe", "1.0", ("register_backends",), ("a",), ("e",), False)
    assert rec.to_dict() == {"name": "acme", "package": "acme-moe", "version": "1.0", "hooks": ["register_backends"],
                             "backends": ["a"], "errors": ["e"], "builtin": False}
    assert PluginRecord("x", warnings=("w",)).to_dict()["warnings"] == ["w"]


@pytest.mark.parametrize("name", [" padded", "padded ", ""])
def test_a_backend_name_with_surrounding_space_is_invalid(name):
    """_validate_backend: a backend's name is a non-empty string without surrounding whitespace."""
    reg = build_registry([("acme", plugin(Fixed(name)))], load_entrypoints=False)
    assert reg.names() == ()
    assert _record(reg, "acme").errors == (f"backend Fixed has no valid name (got {name!r})",)


def test_a_plugin_pluggy_refuses_is_recorded_or_raised():
    """add_plugin: a hook implementation pluggy rejects (an argument the spec lacks) is that plugin's failure."""
    class Bad:
        @hookimpl
        def register_backends(self, config):
            return []

    reg = build_registry([("bad", Bad()), ("good", plugin(Fixed("a")))], load_entrypoints=False)
    rec = _record(reg, "bad")
    assert rec.errors[0].startswith("cannot register plugin: PluginValidationError: ")
    assert (rec.hooks, rec.backends, rec.builtin) == ((), (), False) and reg.names() == ("a",)
    with pytest.raises(PluginError, match=r"^plugin 'bad': cannot register plugin: PluginValidationError"):
        build_registry([("bad", Bad())], load_entrypoints=False, strict=True)


# -- deadlines ------------------------------------------------------------------------------------------------------

@pytest.fixture
def hang(monkeypatch):
    """A short deadline and an event that releases whatever hangs at the end of the test."""
    monkeypatch.setenv("MOEDISPATCH_PLUGIN_TIMEOUT", "0.2")
    release = threading.Event()
    yield release
    release.set()


def _with_entry_point(monkeypatch, ep):
    real = list(mp._entry_points())
    monkeypatch.setattr(mp, "_entry_points", lambda: real + [ep])


def test_an_import_that_hangs_is_a_timeout_record(monkeypatch, hang):
    """build_registry: a third-party import runs under the deadline; a hang is recorded as 'import timed out'."""
    ep = SimpleNamespace(name="slow", value="slow_moe:plugin", load=lambda: hang.wait(5),
                         dist=SimpleNamespace(metadata={"Name": "slow-moe", "Version": "2.1"}, _path="slow:mutants"))
    _with_entry_point(monkeypatch, ep)
    reg = build_registry()
    rec = _record(reg, "slow")
    assert rec == PluginRecord("slow", "slow-moe", "2.1", (), (), ("import timed out after 0.2s",), False)
    assert "emulation" in reg.names()


def test_register_backends_that_hangs_is_a_timeout_record(hang):
    """add_plugin: a third party's register_backends runs under the deadline; a hang is that plugin's error."""
    class Slow:
        @hookimpl
        def register_backends(self):
            hang.wait(5)
            return []

    reg = build_registry([("slow", Slow()), ("good", plugin(Fixed("a")))], load_entrypoints=False)
    assert _record(reg, "slow").errors == ("register_backends timed out after 0.2s",)
    assert reg.names() == ("a",)


def test_a_third_party_entry_point_records_its_distribution(monkeypatch):
    """build_registry: a third-party entry point's record names its distribution and version, builtin False."""
    ep = SimpleNamespace(name="acme", value="acme_moe:plugin", load=lambda: plugin(Fixed("acme-a")),
                         dist=SimpleNamespace(metadata={"Name": "acme-moe", "Version": "1.4"}, _path="acme:mutants"))
    _with_entry_point(monkeypatch, ep)
    rec = _record(build_registry(), "acme")
    assert (rec.package, rec.version, rec.builtin, rec.backends) == ("acme-moe", "1.4", False, ("acme-a",))


def test_a_failed_import_record_is_not_builtin(monkeypatch):
    """record_failure: an entry point that fails to import is recorded with builtin False (a bool)."""
    def boom():
        raise ImportError("no torch")

    _with_entry_point(monkeypatch, SimpleNamespace(name="broken", value="broken_moe", load=boom, dist=None))
    rec = _record(build_registry(), "broken")
    assert rec == PluginRecord("broken", None, None, (), (), ("import failed: ImportError: no torch",), False)


def test_what_a_plugin_prints_while_registering_is_logged_with_its_name(caplog):
    """_Collector.printed: the output becomes a plugin_printed event naming the plugin, the call and the text."""
    class Noisy:
        @hookimpl
        def register_backends(self):
            print("hello from acme")
            return []

    with caplog.at_level(logging.WARNING, logger="moedispatch"):
        build_registry([("acme", Noisy())], load_entrypoints=False)
    events = [r.structlog_event for r in caplog.records
              if getattr(r, "structlog_event", {}).get("event") == "plugin_printed"]
    assert [(e["plugin"], e["call"], e["output"]) for e in events] == [
        ("acme", "register_backends()", "'hello from acme'")]


# -- entry points from dist-info folders ---------------------------------------------------------------------------

def _dist(site, leaf, entry_points=None, metadata=None, meta_file="METADATA"):
    info = site / leaf
    info.mkdir(parents=True)
    if entry_points is not None:
        (info / "entry_points.txt").write_text(entry_points)
    if metadata is not None:
        (info / meta_file).write_text(metadata)
    return info


def test_dist_reads_name_and_version_from_metadata_headers(tmp_path):
    """_Dist/_dist_info: Name and Version from METADATA's header block (the body is not read)."""
    info = _dist(tmp_path, "acme_moe-1.2.dist-info", metadata="Metadata-Version: 2.1\nName: acme-moe\n"
                 "Version: 1.2\n\nName: not-a-header\n")
    assert mp._dist_info(mp._Dist(str(info))) == ("acme-moe", "1.2")
    egg = _dist(tmp_path, "old_moe-0.3.egg-info", metadata="Name: old-moe\nVersion: 0.3\n", meta_file="PKG-INFO")
    assert mp._dist_info(mp._Dist(str(egg))) == ("old-moe", "0.3")
    assert mp._dist_info(None) == (None, None)


def test_entry_points_are_scanned_from_dist_and_egg_info(tmp_path, monkeypatch):
    """_scan_entry_points: the group's lines of entry_points.txt (comments, other groups and extras as written);
    egg-info folders too; the first distribution of a (normalized) name wins, as in importlib.metadata."""
    first, second = tmp_path / "a", tmp_path / "b"
    _dist(first, "acme.moe-1.0.egg-info", "[moedispatch.backends]\n# off = acme.off\n; also = acme.off\n"
          "acme = acme_moe.plugin:register [fast]\n\n[console_scripts]\nacme-cli = acme_moe.cli:main\n",
          "Name: acme.moe\nVersion: 1.0\n", meta_file="PKG-INFO")
    _dist(second, "acme_moe-2.0.dist-info", "[moedispatch.backends]\nacme2 = acme_moe2\n",
          "Name: acme_moe\nVersion: 2.0\n")
    monkeypatch.setattr(sys, "path", [str(first), str(second)])
    found = mp._scan_entry_points("moedispatch.backends")
    assert [(e.name, e.value) for e in found] == [("acme", "acme_moe.plugin:register [fast]")]
    assert mp._dist_info(found[0].dist) == ("acme.moe", "1.0")


def test_a_zip_on_sys_path_falls_back_to_importlib_metadata(tmp_path, monkeypatch):
    """_entry_points: a zip on sys.path is read by importlib.metadata, which still finds the built-ins."""
    zpath = tmp_path / "vendored.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.writestr("vendored/__init__.py", "")
    monkeypatch.setattr(sys, "path", [str(zpath)] + sys.path)
    assert mp._scan_entry_points("moedispatch.backends") is None
    assert set(BUILTIN_EPS) <= {ep.name for ep in mp._entry_points()}


def test_entry_point_load_follows_a_dotted_attribute():
    """_EntryPoint.load: ``module:attr.sub`` imports the module and walks the attributes."""
    assert mp._EntryPoint("x", "moedispatch.selector.plugins:Registry.get", None).load() is mp.Registry.get
    assert mp._EntryPoint("x", "moedispatch.selector.plugins", None).load() is mp


def test_entry_point_load_ignores_extras_as_importlib_does():
    """``name = pkg.mod:attr [extra]`` is valid entry_points.txt syntax (importlib.metadata.EntryPoint.pattern): the
    object is ``attr``, as importlib's own EntryPoint.load returns it — a plugin declared with extras must load."""
    from importlib.metadata import EntryPoint

    value = "moedispatch.selector.plugins:Registry [fast]"
    assert EntryPoint("x", value, "g").load() is mp.Registry
    assert mp._EntryPoint("x", value, None).load() is mp.Registry
    assert mp._EntryPoint("x", "moedispatch.selector.plugins [fast]", None).load() is mp


@pytest.mark.parametrize("value, package, builtin", [
    ("moedispatch_plugins", "moedispatch", True),
    ("moedispatch_plugins:plugin", "moedispatch", True),
    ("moedispatch_plugins.aiter_ck", "moedispatch", True),
    ("moedispatch_plugins_acme:plugin", "moedispatch", False),
    ("moedispatch_plugins.aiter_ck", "acme-moe", False),
])
def test_builtin_trust_comes_from_the_declaring_distribution(value, package, builtin):
    """_is_builtin: moedispatch's own distribution pointing into moedispatch_plugins — never a module name alone."""
    assert mp._is_builtin(SimpleNamespace(value=value), package) is builtin
