"""Which AITER release a version string carries (moedispatch.core.aiter_release): one notion for every range.

AITER builds are versioned by setuptools_scm's default guess-next-dev scheme (ROCm/aiter@e4048607 pyproject.toml
``[tool.setuptools_scm]`` has no ``version_scheme``; setup.py ``use_scm_version=True``): a build N commits after tag
T is T with its last number bumped plus ``.devN`` (the PyPI amd-aiter wheel 0.1.7.post2.dev18 is one), so it holds
T's code and sorts before the release it names. A release candidate (``v0.1.17-rc0``, 5 commits before v0.1.17 and
its ancestor) carries that release. packaging's ``SpecifierSet.contains`` cannot decide these: it excludes
pre-releases by default and ``<V`` never admits a pre-release of V.
"""

from __future__ import annotations

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from moedispatch.core.aiter_release import in_range, range_problem, release_of


@pytest.mark.parametrize("version, release", [
    ("0.1.19", "0.1.19"),
    ("0.1.19+rocm7.1", "0.1.19"),               # a local label
    ("0.1.20+20261201", "0.1.20"),              # AITER's nightly (aiter-release.yaml: last tag + date stamp)
    ("0.1.19rc2", "0.1.19"),
    ("0.1.17rc1.dev3+g1a2b", "0.1.17"),         # a build after a release candidate
    ("0.1.19.dev4+g1a2b", "0.1.19.dev4"),       # 4 commits after a v0.1.18.x tag
    ("0.1.7.post2.dev18", "0.1.7.post2.dev18"),  # the PyPI wheel: after v0.1.7.post1
    (" 0.1.18 ", "0.1.18"),
])
def test_release_of(version, release):
    assert release_of(version) == Version(release)


@pytest.mark.parametrize("version", ["", "not-a-version", "0.1.x"])
def test_release_of_a_version_that_does_not_parse_is_none(version):
    assert release_of(version) is None


@pytest.mark.parametrize("version, spec, inside", [
    ("0.1.19.dev4", "<0.1.19", True),            # packaging: False (a pre-release of the bound)
    ("0.1.19.dev4", ">=0.1.18,<0.1.19", True),   # packaging: False (pre-releases excluded by default)
    ("0.1.19.dev4", ">=0.1.19", False),
    ("0.1.17rc1", ">=0.1.17,<0.1.18", True),     # packaging: False
    ("0.1.17rc1", "<0.1.17", False),
    ("0.1.16.post2", "==0.1.16.post2", True),
    ("0.1.16.post2+rocm7", "==0.1.16.post2", True),
    ("0.1.16.post2", "!=0.1.16.post2", False),
    ("0.1.4", "<=0.1.4", True),
    ("0.1.20.post1", ">0.1.20", True),
    ("nonsense", ">=0.1.0", False),
])
def test_in_range_decides_on_the_release_in_plain_order(version, spec, inside):
    assert in_range(version, spec) is inside


def test_packaging_would_have_decided_the_dev_build_otherwise():
    """Why the ranges are not packaging's: the cases above it answers the other way."""
    assert Version("0.1.19.dev4") not in SpecifierSet("<0.1.19")
    assert not SpecifierSet(">=0.1.17,<0.1.18").contains("0.1.17rc1", prereleases=True)


@pytest.mark.parametrize("spec", ["~=0.1.17", "==0.1.*", "===0.1.17", ">=0.1.x", "0.1.17", ">=0.1.17,"])
def test_a_spec_plain_order_cannot_decide_is_refused(spec):
    assert range_problem(spec)
    with pytest.raises(ValueError):
        in_range("0.1.17", spec)


@pytest.mark.parametrize("spec", [">=0.1.17", ">=0.1.17,<0.1.18", "==0.1.16.post2", "<=0.1.4", " >= 0.1.17 , < 0.1.18"])
def test_a_release_range_is_accepted(spec):
    assert range_problem(spec) is None


def test_the_flydsl_pin_of_a_dev_build_is_its_tag_s():
    """capdb.flydsl_pin: a 0.1.16.post3.dev2 build (after v0.1.16.post2) pins v0.1.16's FlyDSL (aiter.toml
    flydsl_pins ``>=0.1.16,<0.1.17``); packaging's containment gave no pin (a pre-release is excluded by default)."""
    from moedispatch.data import capdb

    assert capdb.flydsl_pin("0.1.16.post3.dev2") == capdb.flydsl_pin("0.1.16")
    assert capdb.flydsl_pin("0.1.17rc0") == capdb.flydsl_pin("0.1.17")


def test_a_release_candidate_has_its_release_s_kernel_features():
    """capdb.features_for_version: a feature whose floor is 0.1.18 (flydsl_a8w4_inter128) is in 0.1.18rc1, as the
    dispatch rules read it (it was absent: 0.1.18rc1 < 0.1.18 in PEP 440 order), and not in a 0.1.18.dev5 build."""
    from moedispatch.data import capdb

    assert "flydsl_a8w4_inter128" in capdb.features_for_version("0.1.18rc1")
    assert "flydsl_a8w4_inter128" not in capdb.features_for_version("0.1.18.dev5")


@pytest.mark.parametrize("version, tag, note", [
    ("0.1.19rc2", "v0.1.19", "is a pre-release of v0.1.19"),
    ("0.1.19.dev4+g1a2b", "v0.1.18", "is a development build, not a release"),
    ("0.1.19", "v0.1.19", None),
])
def test_the_tuned_rows_follow_the_same_release_as_the_rules(version, tag, note):
    """aiter_index.release_for (whose tuned rows a plan reads) agrees with lookup_rules (whose dispatch rules): a
    release candidate of v0.1.19 reads v0.1.19's rows (it read v0.1.18's while its rules were v0.1.19's)."""
    from moedispatch.aiter.rules import lookup_rules
    from moedispatch.data import aiter_index

    got, notes = aiter_index.release_for(version)
    assert got == tag and lookup_rules(version).name.startswith(tag)
    assert (note is None and notes == ()) or (note and note in notes[0])


def test_a_refused_spec_says_which_clause_and_why():
    assert range_problem(">=0.1.17,~=0.1") == "'~=0.1' is not one of ==, !=, <, <=, >, >= and a version"
    assert range_problem(">=x") == "'x' is not a PEP 440 version"


def _aiter_git():
    import os
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "peers" / "aiter"))
    import aiter_src

    spec = os.environ.get("MOEDISPATCH_AITER_SRC") or str(aiter_src.DEFAULT_GIT)
    git = Path(spec.rsplit("@", 1)[0])
    if not (git.exists() and aiter_src._is_git_dir(git)):
        pytest.skip(f"no ROCm/aiter git directory with release tags ({git}): set MOEDISPATCH_AITER_SRC to one")
    return git


def test_every_release_s_flydsl_pin_is_its_setup_py_s():
    """capability_db/aiter.toml flydsl_pins against each release tag's own setup.py FLYDSL_VERSION (read from the
    ROCm/aiter git directory): v0.1.13 pinned ==0.1.4 (not v0.1.13.post1's range), v0.1.16.post4–post6 ==0.2.2, and
    v0.1.12 and v0.1.18 … v0.1.20.post1 had no pin at all (the probe checked none for the default target)."""
    import re
    import subprocess

    from moedispatch.data import aiter_index, capdb

    git = _aiter_git()
    checked = 0
    for rel in aiter_index.releases():
        if rel.version is None:
            continue
        text = subprocess.run(["git", f"--git-dir={git}", "show", f"{rel.tag}:setup.py"], capture_output=True,
                              text=True).stdout
        m = re.search(r'^FLYDSL_VERSION = "flydsl(.*)"', text, re.M)
        pin = capdb.flydsl_pin(str(rel.version))
        if m is None:
            assert pin is None, rel.tag
            continue
        assert pin is not None and pin[0] == m.group(1), (rel.tag, pin, m.group(1))
        checked += 1
    assert checked >= 20
