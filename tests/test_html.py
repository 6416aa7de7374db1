"""``explain --html FILE``: one self-contained page (no network), checked as text and in a real headless Chromium.

The browser tests run when a Chromium is installed (Debian: ``apt-get install -y chromium``; or set
``MOEDISPATCH_CHROMIUM`` to the binary) and skip otherwise; together they take a few seconds.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from moedispatch.render.html import DENSE_COLOR, backend_color, render_html

MAVERICK = "Llama-4-Maverick-17B-128E-Instruct-FP8"


@pytest.fixture(scope="module")
def maverick_page(tmp_path_factory):
    """The page and JSON of Llama-4-Maverick on MI300X (24 MoE layers alternating with 24 dense ones), written by
    the console script."""
    from conftest import run_cli

    folder = tmp_path_factory.mktemp("html")
    page = folder / "plan.html"
    proc = run_cli("explain", "--model", MAVERICK, "--target", "MI300X", "--html", str(page), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return page, json.loads(proc.stdout)


def test_the_page_is_self_contained(maverick_page):
    page, _ = maverick_page
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    # Nothing is loaded from anywhere: no external scripts, styles, images, fonts or imports.
    assert not re.search(r"<(script|img|iframe|link|source|video|audio)\b[^>]*\s(src|href)=", text, re.I)
    assert "@import" not in text and "url(" not in text
    assert text.count("<script>") == 1 and "<style>" in text


def test_one_cell_per_layer_coloured_by_backend(maverick_page):
    page, doc = maverick_page
    text = page.read_text(encoding="utf-8")
    cells = re.findall(r'<a class="cell[^"]*" href="#g(\d+)" data-layer="(\d+)" data-kind="(\w+)" '
                       r'data-backend="([^"]*)" data-group="\d+" style="background-color:(#[0-9a-f]{6})"', text)
    assert [int(c[1]) for c in cells] == list(range(48))
    for group, index, kind, backend, color in cells:
        layer = doc["layers"][int(index)]
        assert kind == layer["kind"] and backend == (layer["backend"] or "")
        assert color == (DENSE_COLOR if kind == "dense" else backend_color(backend))
        assert int(index) in doc["groups"][int(group)]["layers"]
    assert text.count('<section class="group"') == len(doc["groups"]) == 2


def test_rejected_backends_expand_with_every_reason_and_dispatch_and_cost_are_drawn(maverick_page):
    page, doc = maverick_page
    text = page.read_text(encoding="utf-8")
    moe = doc["layers"][1]
    for rej in moe["rejected"]:
        assert f'<details class="rej" data-backend="{rej["backend"]}">' in text
        for reason in rej["reason_details"]:
            assert html.escape(reason["text"], quote=True) in text
    if moe.get("aiter_dispatch"):
        assert "what AITER runs, per token bucket" in text
        for kernel in moe["aiter_dispatch"][0]["kernels"]:
            assert html.escape(kernel) in text
    if moe.get("cost"):
        assert text.count('<svg class="chart"') >= 1 and "tokens per call" in text
    for warning in doc["warnings"]:
        assert html.escape(warning.split(" (")[0], quote=True)[:60] in text


def test_a_layer_with_no_backend_is_hatched_and_the_page_still_written(tmp_path, cli):
    page = tmp_path / "none.html"
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI300X", "--html", str(page),
               env={"MOEDISPATCH_LOAD_PLUGINS": "aiter-flydsl"})
    assert proc.returncode == 3
    text = page.read_text(encoding="utf-8")
    assert text.count('class="cell none"') == 57
    assert "NO BACKEND" in text


@pytest.mark.parametrize("where, message", [
    ("missing/dir/plan.html", "does not exist"),
    (".", "is a folder"),
])
def test_an_unwritable_html_path_is_a_one_line_error(tmp_path, cli, where, message):
    target = str(tmp_path / where)
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "MI300X", "--html", target)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr and "Traceback" not in proc.stderr


def test_explain_without_html_never_imports_the_renderer_or_compare():
    code = ("import sys, io, contextlib\nfrom moedispatch.cli import main\nbuf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf):\n"
            "    rc = main(['explain', '--model', 'Mixtral-8x7B', '--target', 'MI300X'])\n"
            "print(rc, 'moedispatch.render.html' in sys.modules, 'moedispatch.render.compare' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["0", "False", "False"], proc.stderr


def test_third_party_backends_get_a_stable_distinct_colour():
    assert backend_color("acme-moe") == backend_color("acme-moe")
    assert backend_color("acme-moe") != backend_color("other-moe")
    assert re.fullmatch(r"#[0-9a-f]{6}", backend_color("acme-moe"))


def test_render_html_escapes_plugin_text():
    doc = {"schema": "moedispatch.explain/1", "model": {"name": "<m>"}, "target": {"gfx": "gfx942"},
           "parallel": {"tp": 1, "ep": 1}, "fingerprint": "x",
           "layers": [{"index": 0, "kind": "moe", "backend": "<b>", "shape": {}, "quant": {}, "padding": {},
                       "reasons": ["<script>alert(1)</script>"], "rejected": []}],
           "groups": [{"layers": [0]}], "warnings": []}
    text = render_html(doc)
    assert "<script>alert(1)</script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert text.count("<script>") == 1


# -- in a real browser -----------------------------------------------------------------------------------------

def _chromium() -> str | None:
    explicit = os.environ.get("MOEDISPATCH_CHROMIUM")
    if explicit:
        return explicit
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


CHROMIUM = _chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install -y chromium)")


def _browser(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "profile"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
           "--hide-scrollbars", f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, cwd=tmp_path)


def _png_pixels(path: Path, max_rows: int) -> tuple[int, int, list[bytes]]:
    """(width, height, the first ``max_rows`` rows as RGB bytes) of an 8-bit non-interlaced RGB/RGBA PNG (what
    Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    width = height = 0
    color_type = 6
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color_type, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and interlace == 0 and color_type in (2, 6)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    bpp = 4 if color_type == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(min(height, max_rows)):
        start = y * (stride + 1)
        f, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rgb = line if bpp == 3 else bytearray(v for i, v in enumerate(line) if i % 4 != 3)
        rows.append(bytes(rgb))
        prev = line
    return width, height, rows


PROBE = """<script>
(function () {
  var cells = Array.prototype.slice.call(document.querySelectorAll('#layer-map .cell'));
  var drawn = cells.filter(function (c) { var r = c.getBoundingClientRect(); return r.width > 8 && r.height > 8; });
  var colors = {};
  drawn.forEach(function (c) { var k = getComputedStyle(c).backgroundColor; colors[k] = (colors[k] || 0) + 1; });
  var details = document.querySelectorAll('details.rej');
  var first = details[0]; first.open = true;
  var opened = first.querySelector('ul.reasons').getBoundingClientRect().height;
  document.body.setAttribute('data-probe', JSON.stringify({cells: drawn.length, colors: colors,
    groups: document.querySelectorAll('section.group').length, details: details.length, opened: opened,
    charts: document.querySelectorAll('svg.chart').length, title: first.querySelector('summary').title}));
})();
</script></body>"""


def _rgb(hex_color: str) -> str:
    return "rgb({}, {}, {})".format(*(int(hex_color[i:i + 2], 16) for i in (1, 3, 5)))


@needs_chromium
def test_chromium_draws_one_coloured_cell_per_layer(maverick_page, tmp_path):
    page, doc = maverick_page
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE), encoding="utf-8")
    proc = _browser(tmp_path, "--virtual-time-budget=3000", "--dump-dom", probed.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    match = re.search(r'data-probe="([^"]*)"', proc.stdout)
    assert match, proc.stdout[:500]
    probe = json.loads(html.unescape(match.group(1)))
    assert probe["cells"] == 48
    assert probe["colors"] == {_rgb(backend_color("aiter-ck")): 24, _rgb(DENSE_COLOR): 24}
    assert probe["groups"] == 2
    assert probe["details"] == len(doc["layers"][1]["rejected"]) > 0
    assert probe["opened"] > 0  # expanding a rejected backend shows its reasons
    assert probe["title"] == " · ".join(doc["layers"][1]["rejected"][0]["reasons"])  # and hovering shows them all
    if doc.get("cost_total"):
        assert probe["charts"] >= 2


@needs_chromium
def test_chromium_screenshot_shows_the_layer_map(maverick_page, tmp_path):
    page, _ = maverick_page
    shot = tmp_path / "shot.png"
    proc = _browser(tmp_path, "--window-size=1280,900", f"--screenshot={shot}", page.as_uri())
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    width, height, rows = _png_pixels(shot, 400)
    assert (width, height) == (1280, 900)
    counts: dict[bytes, int] = {}
    for row in rows:  # the header and the layer map
        for x in range(0, len(row), 3):
            px = row[x:x + 3]
            counts[px] = counts.get(px, 0) + 1
    blue = bytes(int(backend_color("aiter-ck")[i:i + 2], 16) for i in (1, 3, 5))
    grey = bytes(int(DENSE_COLOR[i:i + 2], 16) for i in (1, 3, 5))
    # 24 cells of each colour, ~30×30 px each less the digits: the map is really drawn, not a blank page.
    assert counts.get(blue, 0) > 24 * 500, counts.get(blue, 0)
    assert counts.get(grey, 0) > 24 * 500, counts.get(grey, 0)
    assert len(counts) > 50  # text, borders, anti-aliasing: a real render


def test_chart_labels_use_the_largest_unit_and_count_tokens_right():
    """Newcomer minor 29: the cost chart's axis said "1000 ms" (1 s) and its tooltips "1 tokens"."""
    from moedispatch.render.html import _chart, _fmt_us, _tick

    assert [_tick(v) for v in (5, 500, 1000, 20_000, 1_000_000, 2_000_000)] == \
        ["5 µs", "500 µs", "1 ms", "20 ms", "1 s", "2 s"]
    assert _fmt_us(1_500_000) == "1.50 s" and _fmt_us(12_345) == "12.3 ms"
    svg = _chart([("aiter-ck", "#123456", [{"tokens": 1, "us": 20.0}, {"tokens": 2, "us": 2_000_000.0}])], "t")
    assert "aiter-ck: 1 token 20 µs" in svg and "aiter-ck: 2 tokens 2.00 s" in svg
    assert ">1 s</text>" in svg and ">1000 ms<" not in svg


def test_each_chart_point_says_its_basis_as_the_text_does():
    """A point's tooltip names its cost's basis, as explain's cost line does (``64 tokens 213 µs (207–234) tuned``):
    a measured row and a roofline guess read differently; a total, which has no basis, says none."""
    from moedispatch.render.html import _chart

    svg = _chart([("aiter-ck", "#123456", [{"tokens": 64, "us": 213.0, "low": 207.0, "high": 234.0, "basis": "tuned"},
                                           {"tokens": 8192, "us": 888.0, "low": 702.0, "high": 1190.0,
                                            "basis": "roofline"}]),
                  ("all MoE layers", "#333", [{"tokens": 64, "us": 9000.0, "low": 8000.0, "high": 9500.0}])], "t")
    assert "aiter-ck: 64 tokens 213 µs (207 µs–234 µs) tuned</title>" in svg
    assert "aiter-ck: 8192 tokens 888 µs (702 µs–1,190 µs) roofline</title>" in svg
    assert "all MoE layers: 64 tokens 9,000 µs (8,000 µs–9,500 µs)</title>" in svg


def test_the_header_says_where_the_target_came_from_in_words(maverick_page):
    """Newcomer minor 7: one provenance notation, the text output's, not a bare "[flag]"."""
    html = maverick_page[0].read_text()
    assert "[flag]" not in html and "(from --target)" in html


# -- the per-bucket band, severe warnings first, the launch (issue 27: the HTML page) ---------------------------------

@pytest.fixture(scope="module")
def minimax_page(tmp_path_factory):
    """MiniMax-M3-MXFP4 TP8 on MI355X / AITER 0.1.20.post1 with its vLLM recipe: AITER runs CK-Tile 1–64 tokens and
    FlyDSL from 512 at the plan's allocation (the dispatch model's steps)."""
    from conftest import run_cli

    page = tmp_path_factory.mktemp("html-band") / "plan.html"
    proc = run_cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--aiter-version", "0.1.20.post1",
                   "--tp", "8", "--tokens", "1,8,64,512,4096", "--recipe", "vllm", "--html", str(page))
    assert proc.returncode == 0, proc.stderr
    return page, proc.stdout


def test_the_chart_has_a_strip_of_what_aiter_runs_per_bucket(minimax_page):
    text = minimax_page[0].read_text()
    steps = re.findall(r'<rect class="band-step" data-family="(\w+)"[^>]*><title>tokens ([^:]+):', text)
    assert steps[:2] == [("cktile", "1"), ("cktile", "8–64")] and ("flydsl", "512") in steps
    assert "the strip: which AITER family runs at which tokens" in text


def test_the_launch_is_on_the_page_with_its_environment(minimax_page):
    text, recipe = minimax_page[0].read_text(), minimax_page[1]
    launch = html.unescape(re.search(r'<pre class="launch mono" id="launch">([^<]*)</pre>', text).group(1))
    assert "export GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0" in launch and "vllm serve amd/MiniMax-M3-MXFP4" in launch
    assert launch.split("vllm serve")[1] in recipe  # the recipe's own command, not another one
    # the launch paths it was chosen among, as the text recipe lists them (issue 23 item 1)
    assert "# launch paths vllm 0.33.0 has for the MoE layers (best first):" in launch
    assert "#   [taken] GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0 " in launch and "#   [taken] GPTOSS" in recipe


def test_emulation_and_crash_warnings_come_first_styled_as_errors():
    from moedispatch.render.html import render_html

    doc = {"schema": "moedispatch.explain/1", "model": {"name": "m"}, "target": {"gfx": "gfx942"},
           "parallel": {"tp": 1, "ep": 1}, "layers": [], "warnings": ["plain one", "57 MoE layer(s) run on emulation",
                                                                       "memory fault at M 304"]}
    text = render_html(doc)
    severe = text.index('id="severe-warnings"')
    assert severe < text.index('id="warnings"') and severe < text.index("run on emulation") < text.index("plain one")
    assert text.index("memory fault") < text.index('id="warnings"')


@needs_chromium
def test_chromium_draws_the_band(minimax_page, tmp_path):
    probe = """<script>
    var r = Array.prototype.slice.call(document.querySelectorAll('rect.band-step')).map(function (e) {
      var b = e.getBoundingClientRect(); return [e.dataset.family, Math.round(b.width), Math.round(b.height)]; });
    document.body.setAttribute('data-probe', JSON.stringify(r));
    </script></body>"""
    probed = tmp_path / "probed.html"
    probed.write_text(minimax_page[0].read_text(encoding="utf-8").replace("</body>", probe), encoding="utf-8")
    proc = _browser(tmp_path, "--virtual-time-budget=3000", "--dump-dom", probed.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    rects = json.loads(html.unescape(re.search(r'data-probe="([^"]*)"', proc.stdout).group(1)))
    assert {f for f, _, _ in rects} >= {"cktile", "flydsl"}
    assert all(w > 10 and h >= 16 for _, w, h in rects)  # drawn, not collapsed


def test_what_if_is_on_the_page_when_asked(tmp_path):
    """explain --what-if --html: the page carries each group's what-if lines the text prints (it dropped them)."""
    from conftest import run_cli

    page = tmp_path / "plan.html"
    proc = run_cli("explain", "--model", "DeepSeek-V4-Pro", "--target", "MI355X", "--tp", "8", "--aiter-version",
                   "0.1.17", "--what-if", "--html", str(page))
    assert proc.returncode == 0, proc.stderr
    lines = [ln.split("what-if ", 1)[1] for ln in proc.stdout.splitlines() if ln.startswith("    what-if ")]
    assert any(ln.startswith("upgrade AITER 0.1.17 → ") for ln in lines)
    text = html.unescape(page.read_text(encoding="utf-8"))
    assert '<div class="what-if"><b>what-if</b>' in text
    assert all(ln.split(" [")[0].removesuffix(" (derived)") in text for ln in lines)


def test_an_existing_file_is_replaced_only_with_a_warning(tmp_path):
    """--html FILE over an existing file says so on stderr (one line); a new file is written silently."""
    from conftest import run_cli

    page = tmp_path / "notes.html"
    page.write_text("my notes\n")
    args = ("explain", "--model", "Mixtral-8x7B", "--target", "MI300X", "--aiter-version", "0.1.18")
    proc = run_cli(*args, "--html", str(page))
    assert proc.returncode == 0, proc.stderr
    assert page.read_text().startswith("<!DOCTYPE html>")
    assert proc.stderr == f"moedispatch: warning: --html {page}: replaced the existing file\n"
    fresh = run_cli(*args, "--html", str(tmp_path / "new.html"))
    assert fresh.returncode == 0 and "replaced" not in fresh.stderr
