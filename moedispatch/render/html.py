"""``explain --html FILE``: the plan as ONE self-contained HTML page (inline CSS, SVG and a few lines of JS; no
network, no CDN, no external file).

The page renders the explain JSON document (:func:`moedispatch.plan.plan.plan_to_json`) and nothing else, so it can never
disagree with ``--format json``: a layer map with one cell per layer coloured by backend (dense layers grey, layers
with no correct backend hatched red), then per group of identical layers its shape, quant, padding, the reasons,
AITER's dispatch per token bucket and the predicted time vs tokens (when the plan has them: ``aiter_dispatch`` and
``cost`` entries, alternatives' costs from the rejected entries), the rejected backends with every reason on hover
and expand, and the plan's warnings. Imported only when ``--html`` is given.
"""

from __future__ import annotations

import hashlib
import math
import os
from html import escape
from typing import Any, Sequence

from moedispatch._util.colour import is_severe
from moedispatch.core.errors import UsageError
from moedispatch.plan.plan import layer_span, plan_to_json
from moedispatch.render.explain import TARGET_WHY, _human_bytes

__all__ = ["render_html", "write_html", "backend_color", "DENSE_COLOR", "NONE_COLOR"]

#: Fixed colours for the built-in backends (colour-blind-friendly where possible); others hash to a hue.
_COLORS = {
    "aiter-ck": "#1f77b4", "aiter-cktile": "#17becf", "aiter-flydsl": "#2ca02c", "aiter-asm": "#9467bd",
    "aiter-triton": "#8c564b", "triton": "#ff7f0e", "emulation": "#e377c2",
}
DENSE_COLOR = "#d0d0d0"
NONE_COLOR = "#b00020"


def backend_color(name: str | None) -> str:
    """The cell colour of a backend (stable across runs): fixed for built-ins, a hashed hue for third parties."""
    if name is None:
        return NONE_COLOR
    if name in _COLORS:
        return _COLORS[name]
    digest = hashlib.sha256(name.encode()).digest()
    hue = int.from_bytes(digest[:2], "big") % 360
    return _hsl_hex(hue, 0.55, 0.45)


def _hsl_hex(h: float, s: float, lightness: float) -> str:
    c = (1 - abs(2 * lightness - 1)) * s
    x = c * (1 - abs((h / 60) % 2 - 1))
    m = lightness - c / 2
    r, g, b = [(c, x, 0), (x, c, 0), (0, c, x), (0, x, c), (x, 0, c), (c, 0, x)][int(h // 60) % 6]
    return "#" + "".join(f"{round((v + m) * 255):02x}" for v in (r, g, b))


_CSS = """
:root { --fg:#1b1b1b; --muted:#5b5b5b; --line:#dedede; --bg:#fff; --card:#fafafa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--fg);
       background: var(--bg); margin: 0; padding: 20px 28px 40px; max-width: 1280px; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 26px 0 8px; }
h3 { font-size: 15px; margin: 0 0 6px; }
.meta { color: var(--muted); margin: 2px 0; } code, .mono { font-family: ui-monospace, "DejaVu Sans Mono", monospace;
       font-size: 12.5px; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 16px; margin: 10px 0 8px; }
.legend span { display: inline-flex; align-items: center; gap: 6px; }
.sw { width: 14px; height: 14px; border-radius: 3px; display: inline-block; border: 1px solid rgba(0,0,0,.15); }
.map { display: grid; grid-template-columns: repeat(auto-fill, 34px); gap: 4px; margin: 8px 0 4px; }
.cell { height: 34px; border-radius: 4px; display: flex; align-items: center; justify-content: center;
        color: #fff; font-size: 11px; text-decoration: none; border: 2px solid transparent; }
.cell.dense { color: #555; } .cell.none { background-image: repeating-linear-gradient(45deg, transparent 0 4px,
        rgba(255,255,255,.35) 4px 7px); }
.cell.hl, .cell:hover { border-color: #000; }
.group { background: var(--card); border: 1px solid var(--line); border-left: 6px solid var(--c); border-radius: 6px;
         padding: 12px 16px; margin: 12px 0; }
.group:target { box-shadow: 0 0 0 3px #ffd54f; }
.kv { display: grid; grid-template-columns: 88px 1fr; gap: 2px 10px; margin: 6px 0; }
.kv > div:nth-child(odd) { color: var(--muted); }
ul.reasons { margin: 4px 0 4px 18px; padding: 0; } ul.reasons li { margin: 2px 0; }
.kind { font-size: 11px; color: var(--muted); border: 1px solid var(--line); border-radius: 3px; padding: 0 4px;
        margin-right: 4px; }
details.rej { margin: 3px 0; } details.rej summary { cursor: pointer; }
details.rej summary b { color: var(--fg); } details.rej summary .first { color: var(--muted); }
table.dispatch { border-collapse: collapse; margin: 6px 0; font-size: 12.5px; }
table.dispatch th, table.dispatch td { border: 1px solid var(--line); padding: 3px 7px; text-align: left;
       vertical-align: top; }
table.dispatch th { background: #f0f0f0; }
.chart { display: block; margin: 6px 0; } .chart text { font-size: 11px; fill: #444; }
.warn { background: #fff8e1; border: 1px solid #f3d27a; border-radius: 6px; padding: 8px 14px; margin: 6px 0; }
.warn li { margin: 3px 0; }
.warn.severe { background: #fdecea; border-color: #e57373; } .warn.severe .kind { color: #b00020; border-color: #e57373; }
.chart .band text { font-size: 10px; fill: #fff; } .launch { white-space: pre-wrap; background: #f4f4f4;
       border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; }
a { color: #0b57d0; }
"""

_JS = """
document.querySelectorAll('.cell').forEach(function (c) {
  c.addEventListener('mouseenter', function () {
    document.querySelectorAll('.cell[data-group="' + c.dataset.group + '"]').forEach(function (o) {
      o.classList.add('hl'); });
  });
  c.addEventListener('mouseleave', function () {
    document.querySelectorAll('.cell.hl').forEach(function (o) { o.classList.remove('hl'); });
  });
});
"""


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _source(source: str | None) -> str:
    if not source:
        return ""
    if source.startswith(("https://", "http://")) and " " not in source:
        return f' <span class="src">(<a href="{_e(source)}" rel="noreferrer">{_e(source)}</a>)</span>'
    return f' <span class="src">({_e(source)})</span>'


def _reason_items(details: Sequence[dict[str, Any]], fallback: Sequence[str]) -> str:
    items = []
    if details:
        for r in details:
            conf = "" if r.get("confidence") in (None, "confirmed") else f" <i>({_e(r['confidence'])})</i>"
            items.append(f'<li><span class="kind">{_e(r.get("kind", ""))}</span>{_e(r.get("text", ""))}'
                         f'{_source(r.get("source"))}{conf}</li>')
    else:
        items = [f"<li>{_e(t)}</li>" for t in fallback]
    return '<ul class="reasons">' + "".join(items) + "</ul>"


def _span(indices: Sequence[int]) -> str:
    return layer_span(list(indices))


def _band(steps: Sequence[dict[str, Any]], tokens: Sequence[int], px: Any, x_lo: float, x_hi: float,
          y: float) -> str:
    """The per-bucket strip: one rectangle per dispatch step, from halfway to the previous planned token count to
    halfway to the next (log scale), coloured as the family's backend, named inside when it fits."""
    xs = [px(t) for t in tokens]
    edges = [x_lo] + [(a + b) / 2 for a, b in zip(xs, xs[1:])] + [x_hi]
    out = ['<g class="band" data-steps="%d">' % len(steps)]
    for st in steps:
        lo, hi = (list(st.get("tokens") or []) + [None, None])[:2]
        if lo is None or hi is None:
            continue
        inside = [i for i, t in enumerate(tokens) if lo <= t <= hi]
        if not inside:
            continue
        x0, x1 = edges[inside[0]], edges[inside[-1] + 1]
        fam = str(st.get("family") or "?")
        color = NONE_COLOR if st.get("raises") else backend_color(f"aiter-{fam}")
        span = f"{lo}" if lo == hi else f"{lo}–{hi}"
        what = f"AITER raises: {st['raises']}" if st.get("raises") else (
            f"{fam} {st.get('stages', '')}-stage: {' + '.join(st.get('kernels') or [])}")
        out.append(f'<rect class="band-step" data-family="{_e(fam)}" x="{x0 + 0.5:.1f}" y="{y:.1f}" '
                   f'width="{max(x1 - x0 - 1, 1):.1f}" height="18" rx="3" fill="{color}"><title>tokens {_e(span)}: '
                   f'{_e(what)}</title></rect>')
        if x1 - x0 > 6 * len(fam) + 6:
            out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{y + 13:.1f}" text-anchor="middle">{_e(fam)}</text>')
    out.append(f'<text x="{x_hi + 8:.1f}" y="{y + 13:.1f}" style="fill:#444">AITER runs</text></g>')
    return "".join(out)


def _fmt_us(us: float) -> str:
    if us >= 1_000_000:
        return f"{us / 1e6:,.2f} s"
    if us >= 10_000:
        return f"{us / 1000:,.1f} ms"
    return f"{us:,.0f} µs" if us >= 10 else f"{us:.1f} µs"


def _tick(us: float) -> str:
    """An axis label in the largest unit that keeps it at or above 1: 500 µs, 1 ms, 20 ms, 1 s."""
    if us >= 1_000_000:
        return f"{us / 1e6:g} s"
    return f"{us / 1000:g} ms" if us >= 1000 else f"{us:g} µs"


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


def _chart(series: Sequence[tuple[str, str, Sequence[dict[str, Any]]]], title: str,
           dispatch: Sequence[dict[str, Any]] = ()) -> str:
    """An inline SVG of predicted time (µs, log) vs tokens (log): one line per series with its low–high band; with
    ``dispatch`` (the chosen path's AITER steps), a strip under the x axis of which family runs at which tokens."""
    points = [c for _, _, costs in series for c in costs if c.get("us")]
    if not points:
        return ""
    tokens = sorted({int(c["tokens"]) for c in points})
    lows = [float(c.get("low") or c["us"]) for c in points]
    highs = [float(c.get("high") or c["us"]) for c in points]
    strip = 26 if dispatch else 0
    w, h, left, right, top, bottom = 560, 220 + strip, 64, 150, 14, 34 + strip
    x0, x1 = math.log10(max(tokens[0], 1)), math.log10(max(tokens[-1], 1))
    if x1 - x0 < 1e-9:
        x0, x1 = x0 - 0.5, x1 + 0.5
    y0, y1 = math.log10(max(min(lows), 1e-3)), math.log10(max(highs))
    if y1 - y0 < 1e-9:
        y0, y1 = y0 - 0.5, y1 + 0.5
    pad = (y1 - y0) * 0.06
    y0, y1 = y0 - pad, y1 + pad

    def px(t: float) -> float:
        return left + (math.log10(max(t, 1)) - x0) / (x1 - x0) * (w - left - right)

    def py(us: float) -> float:
        return top + (1 - (math.log10(max(us, 1e-3)) - y0) / (y1 - y0)) * (h - top - bottom)

    out = [f'<svg class="chart" role="img" aria-label="{_e(title)}" width="{w}" height="{h}" '
           f'viewBox="0 0 {w} {h}" xmlns="http://www.w3.org/2000/svg">',
           f'<rect x="{left}" y="{top}" width="{w - left - right}" height="{h - top - bottom}" fill="#fff" '
           'stroke="#ccc"/>']
    for t in tokens:
        out.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{top}" y2="{h - bottom}" stroke="#eee"/>'
                   f'<text x="{px(t):.1f}" y="{h - bottom + 14}" text-anchor="middle">{t}</text>')
    steps = (1,) if y1 - y0 > 2.5 else (1, 2, 5)  # 1-2-5 ticks when the range spans few decades
    ticks = [m * 10 ** k for k in range(math.floor(y0), math.ceil(y1) + 1) for m in steps]
    for value in ticks:
        if y0 <= math.log10(value) <= y1:
            out.append(f'<line x1="{left}" x2="{w - right}" y1="{py(value):.1f}" y2="{py(value):.1f}" stroke="#eee"/>'
                       f'<text x="{left - 6}" y="{py(value) + 4:.1f}" text-anchor="end">{_tick(value)}</text>')
    out.append(f'<text x="{(left + w - right) / 2:.0f}" y="{h - strip - 4}" text-anchor="middle">tokens per call'
               '</text>')
    if dispatch:
        out.append(_band(dispatch, tokens, px, left, w - right, h - strip + 2))
    for n, (name, color, costs) in enumerate(series):
        pts = sorted((int(c["tokens"]), float(c["us"]), float(c.get("low") or c["us"]), float(c.get("high") or c["us"]),
                      " — ".join(filter(None, (str(c.get("basis") or ""), str(c.get("detail") or "")))))
                     for c in costs if c.get("us"))
        if not pts:
            continue
        band = [f"{px(t):.1f},{py(hi):.1f}" for t, _, _, hi, _ in pts] + \
               [f"{px(t):.1f},{py(lo):.1f}" for t, _, lo, _, _ in reversed(pts)]
        out.append(f'<polygon points="{" ".join(band)}" fill="{color}" fill-opacity="0.13" stroke="none"/>')
        line = " ".join(f"{px(t):.1f},{py(us):.1f}" for t, us, _, _, _ in pts)
        dash = "" if n == 0 else ' stroke-dasharray="5 3"'
        out.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="{2.5 if n == 0 else 1.6}"'
                   f"{dash}/>")
        for t, us, lo, hi, basis in pts:   # the basis as explain's text prints it (a total has none)
            out.append(f'<circle cx="{px(t):.1f}" cy="{py(us):.1f}" r="3" fill="{color}"><title>{_e(name)}: '
                       f"{_tokens(t)} {_e(_fmt_us(us))} ({_e(_fmt_us(lo))}–{_e(_fmt_us(hi))})"
                       f"{' ' + _e(basis) if basis else ''}</title></circle>")
        ly = top + 12 + n * 16
        out.append(f'<line x1="{w - right + 10}" x2="{w - right + 28}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" '
                   f'stroke-width="2.5"{dash}/><text x="{w - right + 32}" y="{ly}">{_e(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def _dispatch_table(steps: Sequence[dict[str, Any]]) -> str:
    rows = ["<tr><th>tokens</th><th>AITER runs</th><th>kernels</th><th>block_m</th><th>activations</th>"
            "<th>basis</th></tr>"]
    for s in steps:
        lo, hi = (list(s.get("tokens") or []) + [None, None])[:2]
        span = f"{lo}" if lo == hi else f"{lo}–{hi}"
        basis = _e(s.get("basis", ""))
        if s.get("config"):
            basis += f'<br><span class="mono">{_e(s["config"])}</span>'
        rows.append(f"<tr><td>{_e(span)}</td><td>{_e(s.get('family', ''))} {_e(s.get('stages', ''))}-stage</td>"
                    f"<td class=\"mono\">{'<br>'.join(_e(k) for k in s.get('kernels') or [])}</td>"
                    f"<td>{_e(s.get('block_m', ''))}</td><td>{_e(s.get('activation_dtype', ''))}</td>"
                    f"<td>{basis}</td></tr>")
    return '<table class="dispatch">' + "".join(rows) + "</table>"


def _padding_text(entry: dict[str, Any]) -> str:
    p = entry.get("padding") or {}
    shape = entry.get("shape") or {}
    if not (p.get("hidden_pad") or p.get("intermediate_pad")):
        return "none needed"
    extra = entry.get("padded_bytes")   # what the table says too: the padded weights' memory
    return (f"hidden {shape.get('hidden')}→{p.get('hidden')}, intermediate/rank {shape.get('intermediate_per_rank')}→"
            f"{p.get('intermediate_per_rank')}; kernel pads hidden={p.get('kernel_hidden_pad')} intermediate="
            f"{p.get('kernel_intermediate_pad')} ({p.get('pad_semantics', 'compute')}); zero-fill "
            f"{'yes' if p.get('zero_fill') else 'no'}" + (f"; +{_human_bytes(extra)}/rank per layer" if extra else ""))


def _group_section(n: int, group: dict[str, Any], entry: dict[str, Any]) -> str:
    idx = group["layers"]
    kind = entry["kind"]
    backend = entry.get("backend")
    color = DENSE_COLOR if kind == "dense" else backend_color(backend)
    count = f"{len(idx)} {'MoE' if kind == 'moe' else 'dense'}"
    title = "dense MLP" if kind == "dense" else (backend or "NO BACKEND")
    parts = [f'<section class="group" id="g{n}" style="--c:{color}" data-backend="{_e(backend or "")}">',
             f"<h3>{_e(_span(idx))} ({_e(count)}) → {_e(title)}</h3>"]
    shape, quant = entry.get("shape") or {}, entry.get("quant") or {}
    if kind == "dense":
        parts.append(f'<div class="meta">hidden {_e(shape.get("hidden"))}, intermediate '
                     f'{_e(shape.get("intermediate"))}: no MoE backend</div></section>')
        return "".join(parts)
    parts.append('<div class="kv">')
    parts.append(f"<div>shape</div><div>hidden {_e(shape.get('hidden'))}, intermediate {_e(shape.get('intermediate'))}"
                 f" → {_e(shape.get('intermediate_per_rank'))}/rank, experts {_e(shape.get('experts'))} → "
                 f"{_e(shape.get('experts_per_rank'))}/rank, top-{_e(shape.get('top_k'))}, "
                 f"{_e(entry.get('activation_fn', ''))}</div>")
    parts.append(f"<div>quant</div><div>weights {_e(quant.get('weight'))} {_e(quant.get('granularity') or '')}, "
                 f"activations {_e(quant.get('activation'))} {_e(quant.get('activation_granularity') or '')}"
                 f"{(' ' + _e(quant['activation_scales'])) if quant.get('activation_scales') else ''}</div>")
    if backend:
        parts.append(f"<div>padding</div><div>{_e(_padding_text(entry))}</div>")
    parts.append("</div>")
    if group.get("what_if"):  # explain --what-if --html: the same per-group lines the text shows
        parts.append('<div class="what-if"><b>what-if</b>'
                     + _reason_items([], [t.removeprefix("what-if: ") for t in group["what_if"]]) + "</div>")
    parts.append("<div><b>why</b>" + _reason_items(entry.get("reason_details") or [], entry.get("reasons") or [])
                 + "</div>")
    if entry.get("aiter_dispatch"):
        parts.append("<div><b>what AITER runs, per token bucket</b>" + _dispatch_table(entry["aiter_dispatch"])
                     + "</div>")
    series = []
    if entry.get("cost"):
        series.append((backend or "?", color, entry["cost"]))
    for rej in entry.get("rejected") or []:
        if rej.get("cost"):
            series.append((rej["backend"], backend_color(rej["backend"]), rej["cost"]))
    if series:
        parts.append("<div><b>predicted time vs tokens</b> (one rank, one layer; band: low–high"
                     + ("; the strip: which AITER family runs at which tokens" if entry.get("aiter_dispatch") else "")
                     + ")" + _chart(series, f"predicted time of {_span(idx)}", entry.get("aiter_dispatch") or ())
                     + "</div>")
    rejected = entry.get("rejected") or []
    if rejected:
        parts.append(f"<div><b>not chosen</b> ({len(rejected)})")
        for rej in rejected:
            first = (rej.get("reasons") or [""])[0]
            all_text = " · ".join(rej.get("reasons") or [])
            parts.append(f'<details class="rej" data-backend="{_e(rej["backend"])}"><summary title="{_e(all_text)}">'
                         f'<span class="sw" style="background:{backend_color(rej["backend"])}"></span> '
                         f'<b>{_e(rej["backend"])}</b> <span class="first">— {_e(first[:160])}'
                         f'{"…" if len(first) > 160 else ""}</span></summary>'
                         + _reason_items(rej.get("reason_details") or [], rej.get("reasons") or []) + "</details>")
        parts.append("</div>")
    parts.append("</section>")
    return "".join(parts)


def render_html(doc: dict[str, Any], *, first_line: str | None = None, launch: str | None = None) -> str:
    """The page for an explain JSON document (``plan_to_json(plan)``); ``launch``: the recipe's command (``explain
    --recipe E --html``), shown under the header."""
    layers = doc["layers"]
    groups = doc.get("groups") or [{"layers": [entry["index"]]} for entry in layers]
    group_of = {i: n for n, g in enumerate(groups) for i in g["layers"]}
    by_index = {entry["index"]: entry for entry in layers}
    model, target, par = doc["model"], doc["target"], doc["parallel"]
    head = (f"{target.get('gfx')} ({target.get('product')})" if target.get("product") else str(target.get("gfx")))
    if target.get("partition"):
        head += f", {target['partition']} partition"
    if target.get("compute_units"):
        head += f", {target['compute_units']} CUs"
    device = head  # what "(from --target)" qualifies: the GPU, not the AITER version (the table's order)
    head += f", AITER {target['aiter_version']}" if target.get("aiter_version") else ", no AITER"
    moe = [e for e in layers if e["kind"] == "moe"]
    title = f"moedispatch: {model.get('name')} on {head}"

    cells = []
    for entry in layers:
        i, backend, kind = entry["index"], entry.get("backend"), entry["kind"]
        if kind == "dense":
            cls, color, label = "cell dense", DENSE_COLOR, "dense MLP"
        elif backend is None:
            cls, color, label = "cell none", NONE_COLOR, "NO BACKEND"
        else:
            cls, color, label = "cell", backend_color(backend), backend
        p = entry.get("padding") or {}
        tip = f"layer {i}: {label}"
        if kind == "moe" and backend and (p.get("hidden_pad") or p.get("intermediate_pad")):
            tip += f" — padded to hidden {p.get('hidden')}, intermediate/rank {p.get('intermediate_per_rank')}"
        cells.append(f'<a class="{cls}" href="#g{group_of[i]}" data-layer="{i}" data-kind="{kind}" '
                     f'data-backend="{_e(backend or "")}" data-group="{group_of[i]}" style="background-color:{color}" '
                     f'title="{_e(tip)}">{i}</a>')
    used = list(dict.fromkeys(e.get("backend") for e in moe if e.get("backend")))
    legend = [f'<span><i class="sw" style="background:{backend_color(b)}"></i>{_e(b)} '
              f'({sum(1 for e in moe if e.get("backend") == b)})</span>' for b in used]
    if any(e.get("backend") is None for e in moe):
        legend.append(f'<span><i class="sw" style="background:{NONE_COLOR}"></i>no correct backend '
                      f'({sum(1 for e in moe if e.get("backend") is None)})</span>')
    if len(moe) < len(layers):
        legend.append(f'<span><i class="sw" style="background:{DENSE_COLOR}"></i>dense MLP '
                      f'({len(layers) - len(moe)})</span>')

    body = [f"<h1>{_e(model.get('name'))}</h1>"]
    if first_line:
        body.append(f'<div class="meta">{_e(first_line)}</div>')
    why = TARGET_WHY.get(target.get("source"), target.get("source"))
    body.append(f'<div class="meta">target {_e(device)} ({_e(why)}){_e(head[len(device):])} · tp={_e(par.get("tp"))} '
                f'ep={_e(par.get("ep"))} · {len(moe)} MoE of {len(layers)} layers · plan fingerprint '
                f'<code>{_e(doc.get("fingerprint", ""))}</code></div>')
    if launch:
        body.append('<h2>Launch</h2><pre class="launch mono" id="launch">' + _e(launch) + "</pre>")
    body.append('<h2>Layer map</h2><div class="legend">' + "".join(legend) + "</div>")
    body.append(f'<div class="map" id="layer-map" data-layers="{len(layers)}">' + "".join(cells) + "</div>")
    body.append('<div class="meta">Hover a cell to see its group; click it to jump to the decision.</div>')
    if doc.get("cost_total"):
        series = [("all MoE layers", "#333", doc["cost_total"])]
        body.append("<h2>Predicted MoE time per forward pass (one rank)</h2>"
                    + _chart(series, "predicted MoE time per forward pass"))
    if doc.get("padded_bytes"):
        body.append(f'<div class="meta" id="padded-bytes">padding adds {_e(_human_bytes(doc["padded_bytes"]))} of '
                    "expert weights per rank over the whole model</div>")
    if doc.get("warnings"):
        details = doc.get("warning_details") or [{"text": t, "kind": "warning"} for t in doc["warnings"]]
        severe = [d for d in details if is_severe(d.get("text", ""))]
        other = [d for d in details if not is_severe(d.get("text", ""))]
        body.append("<h2>Warnings</h2>")
        if severe:  # what must not serve as is (emulation, a GPU fault or crash): first, styled as errors
            body.append('<div class="warn severe" id="severe-warnings">' + _reason_items(severe, []) + "</div>")
        if other:
            body.append('<div class="warn" id="warnings">' + _reason_items(other, []) + "</div>")
    body.append("<h2>Decisions by group</h2>")
    for n, group in enumerate(groups):
        body.append(_group_section(n, group, by_index[group["layers"][0]]))
    body.append('<p class="meta">Generated by moedispatch explain --html; the same plan as <code>--format json</code>'
                f' (schema {_e(doc.get("schema", ""))}).</p>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
            + "\n".join(body) + f"<script>{_JS}</script></body></html>\n")


def write_html(plan: Any, path: str, *, first_line: str | None = None, launch: str | None = None) -> str:
    """Write the page of ``plan`` to ``path`` (atomically: a temporary file renamed into place); a one-line
    :class:`UsageError` when the path cannot be written. Returns the path."""
    text = render_html(plan_to_json(plan), first_line=first_line, launch=launch)
    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    if os.path.isdir(target):
        raise UsageError(f"--html {path}: is a folder; give a file name, e.g. {os.path.join(path, 'plan.html')}")
    if not os.path.isdir(folder):
        raise UsageError(f"--html {path}: folder {folder} does not exist")
    tmp = f"{target}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise UsageError(f"--html {path}: cannot write: {exc.strerror or exc}") from None
    return path
