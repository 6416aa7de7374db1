"""The heuristic band's evidence (moedispatch.cost.heuristic, issue 26 item 2): the published same-shape A/Bs of
AITER's untuned default against a tuned row, read and validated from capability_db/cost_heuristic_evidence.toml, the
band derived from them and its held-out coverage. The cases that motivated it: the cited "1.3–2.3×" could not be
found in ROCm/aiter#3911 (which compares two different keys) or #1528 (1.10–1.78× at 1–8 tokens on MI308X)."""

from __future__ import annotations

import copy
import math
import statistics

import pytest

from moedispatch.core.errors import CapabilityDBError
from moedispatch.cost import heuristic
from moedispatch.data import capdb


@pytest.fixture(scope="module")
def doc():
    return capdb.load_toml(heuristic.EVIDENCE_FILE)


@pytest.fixture(scope="module")
def pairs():
    return heuristic.load_evidence()


def test_the_evidence_is_the_four_threads_with_their_printed_numbers(pairs):
    """17 token counts from 4 threads; ROCm/aiter#1528's 4-token cliff (191.2 vs 107.6 µs on MI308X) and
    sglang#37072's 2→4 token cliff of AITER's default heuristic (27.6 → 38.7 µs, tuned 31.4) are in it."""
    assert len(pairs) == 17
    by = {(p.source.rsplit("/", 3)[-3], p.source.rsplit("/", 1)[-1], p.tokens): p for p in pairs}
    assert len({p.source for p in pairs}) == 4
    p = by[("aiter", "1528", 4)]
    assert (p.gfx, p.cu, p.untuned_us, p.tuned_us) == ("gfx942", 80, 191.2, 107.6)
    assert p.ratio == pytest.approx(1.777, abs=1e-3)
    z2, z4 = by[("sglang", "37072", 2)], by[("sglang", "37072", 4)]
    assert (z2.untuned_us, z4.untuned_us, z4.tuned_us) == (27.6, 38.7, 31.4)
    assert by[("ATOM", "2200", 131072)].ratio == pytest.approx(49194 / 37329)
    assert all(p.ratio > 1 for p in pairs)           # in every published same-shape A/B, the tuned row was faster


def test_the_leads_left_out_say_why(doc):
    """#3911 (different keys), #3453 (its baseline ran another default path), #5213 (the default cannot run)."""
    excluded = {e["source"].rsplit("/", 1)[-1]: e["why"] for e in doc["excluded"]}
    assert set(excluded) == {"3911", "3453", "5213"}
    assert "not the same shape" in excluded["3911"] and "cannot run" in excluded["5213"]


def test_the_band_is_the_median_and_holds_as_many_pairs_as_p10_p90_from_one(pairs):
    """factor = median ratio; low/high = drift.band_of of the ratios: p10 is above 1 here, so low is 1 (a tuned row
    is the fastest of a sweep that includes the default's kernel) and the band moves down to it: p10–p90 (nearest
    rank) holds ratios 2..16 of 17, so [1, high] holds ratios 1..15 — high is the 15th, 1.318 (ATOM#2200 at 128k
    tokens), not the p90 1.643 ([1, p90] held 16 of 17 in-sample, 94%)."""
    b = heuristic.band(pairs)
    ratios = sorted(p.ratio for p in pairs)
    assert b["factor"] == round(statistics.median(ratios), 4) == 1.1695
    assert b["low"] == 1.0 and b["high"] == math.ceil(ratios[14] * 1e4) / 1e4 == 1.3179
    assert sum(b["low"] <= r <= b["high"] for r in ratios) == 15 == len(ratios[1:16])
    assert (b["n"], b["threads"]) == (17, 4) and b["confidence"] == "derived"


def test_coverage_holds_each_thread_out():
    """Two threads: each is checked against the band of the other only (not against a band it helped derive)."""
    mk = lambda src, ratios: [heuristic.Pair(src, "gfx950", 256, i + 1, r, 1.0)  # noqa: E731
                              for i, r in enumerate(ratios)]
    a = mk("https://github.com/x/y/pull/1", [1.1, 1.2, 1.3])
    b = mk("https://github.com/x/y/pull/2", [2.0, 2.1, 3.0])
    share, n = heuristic.held_out_coverage(a + b)
    # band of b alone: [1.0, 3.0] holds all of a; band of a alone: [1.0, 1.3] holds none of b
    assert (share, n) == (0.5, 6)


def test_coverage_counts_a_ratio_on_a_bar_as_inside():
    """The bars are closed: a held-out ratio equal to the other thread's low (1, untuned as fast as tuned) or high
    end is inside."""
    mk = lambda src, ratios: [heuristic.Pair(src, "gfx950", 256, i + 1, r, 1.0)  # noqa: E731
                              for i, r in enumerate(ratios)]
    a = mk("https://github.com/x/y/pull/1", [1.0, 1.5])
    b = mk("https://github.com/x/y/pull/2", [1.2, 1.5])
    assert heuristic.band(b)["high"] == 1.5 and heuristic.band(a)["low"] == 1.0
    assert heuristic.held_out_coverage(a + b) == (1.0, 4)


def test_the_shipped_coverage(pairs):
    """13 of the 17 inside a band derived without their own thread: #1528's 1.64× and 1.78× fall outside the band of
    the other three threads (1.0–1.23×), and so do ATOM#2200's 1.30× and 1.32× (the others' band is 1.0–1.23×);
    sglang#37072's nine and #5144's two are inside. The goal is 75–85% (issue 26); with [1, p90] it was 15 (88%)."""
    share, n = heuristic.held_out_coverage(pairs)
    assert (round(share * n), n) == (13, 17)


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.update(schema="x/0"), "schema must be"),
    (lambda d: d.pop("pair"), "needs at least one [[pair]]"),
    (lambda d: d["pair"][0].pop("where"), "[[pair]] #1 needs non-empty strings"),
    (lambda d: d["pair"][1].update(source="sglang#37072"), "[[pair]] #2: source must be the thread's https"),
    (lambda d: d["pair"][0].update(cu=-1), "cu must be a whole number"),
    (lambda d: d["pair"][0]["tuned_us"].pop(), "must be lists of the same length"),
    (lambda d: d["pair"][2]["untuned_us"].__setitem__(0, 0), "[[pair]] #3: needs positive finite numbers"),
    (lambda d: d["pair"][0]["tokens"].__setitem__(0, 0), "tokens must be whole numbers >= 1"),
    (lambda d: d["pair"][3].update(source=d["pair"][0]["source"]), "one [[pair]] table per thread"),
    (lambda d: d["excluded"][0].pop("why"), "[[excluded]] #1 needs non-empty strings source and why"),
])
def test_a_broken_evidence_file_is_one_line_naming_the_entry(doc, edit, words):
    bad = copy.deepcopy(doc)
    edit(bad)
    with pytest.raises(CapabilityDBError) as err:
        heuristic.parse_evidence(bad)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith(f"capability_db/{heuristic.EVIDENCE_FILE}")


def test_the_file_validates_against_its_schema(doc):
    """docs/schemas/cost_heuristic_evidence.schema.json holds the file, and is not vacuous."""
    import json
    from pathlib import Path

    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(__file__).resolve().parents[1] / "docs" / "schemas" /
                         "cost_heuristic_evidence.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(doc, schema)
    bad = copy.deepcopy(doc)
    bad["pair"][0]["tuned_us"][0] = -1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_ratios_are_untuned_over_tuned():
    p = heuristic.Pair("https://github.com/x/y/pull/1", "gfx942", 80, 4, 191.2, 107.6)
    assert p.ratio == pytest.approx(191.2 / 107.6) and not math.isclose(p.ratio, 107.6 / 191.2)
