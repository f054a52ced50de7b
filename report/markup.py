"""The report's text as HTML, from the facts: one markup for Qt's QTextDocument (PDF) and for web browsers (HTML).

Charts are left to the caller (`chart(name, width_px, height_px) -> str`): vector objects in the PDF, inline SVG in
HTML.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from html import escape
from typing import Any

from engine.core.units import format_bytes
from render.colors import category_hex

from .content import Facts, fmt_bytes

_HEAD_BG = "#E3E8EE"
_ALT_BG = "#F5F7F9"
_GOOD = "#1E7B34"
_BAD = "#B3261E"
_WARN = "#9A6700"

BROWSER_CSS = """
body { font-family: "DejaVu Sans", "Segoe UI", Helvetica, Arial, sans-serif; font-size: 10pt; color: #1E1E1E;
       max-width: 820px; margin: 2em auto; padding: 0 1em; }
h1 { font-size: 18pt; margin-bottom: 0.2em; } h2 { font-size: 13pt; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.4em 0 0.8em 0; } td, th { padding: 3px 6px; vertical-align: top; }
th { text-align: left; } .muted { color: #5A5A5A; } .small { font-size: 8.5pt; } figure { margin: 0.6em 0; }
.swatch { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.4em; vertical-align: middle; }
"""


def _pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{100.0 * x:.{digits}f} %"


def _signed_pct(x: float | None) -> str:
    return "–" if x is None else f"{100.0 * x:+.1f} %"


def _count(n: int | None) -> str:
    # A narrow no-break space: reads well in any locale, and a number never breaks across lines.
    return "–" if n is None else f"{n:,}".replace(",", "\u202f")


def _breakdown_table(rows: list[dict[str, Any]], share: str) -> str:
    t = _Table(["Category", "Bytes", "Size", share], "lrrr", widths=[40, 22, 18, 20])
    for r in rows:
        swatch = f'<span style="color: {category_hex(r["category"])};">■</span> '
        t.rows.append(
            ([swatch + escape(r["label"]), _count(r["bytes"]), format_bytes(r["bytes"]), _pct(r["share"])],
             {"bold": False})
        )
    total = sum(r["bytes"] for r in rows)
    t.add(["Total", _count(total), format_bytes(total), "100.0 %"], bold=True)
    return t.html()


_NO_BREAK_SPACE = re.compile(r"[ \u202f](?![^<]*>)")  # a space outside any tag (Qt breaks at U+202F too)


def _breakable(name: str, browser: bool, line_chars: int | None = None) -> str:
    """A dotted module name (escaped HTML) that a browser wraps after its dots and underscores, not inside a
    word. The PDF gets the plain name (a zero-width space would break searching the PDF), broken after a dot only
    where it is longer than `line_chars`: Qt widens a table to its longest word, past the page's edge."""
    if browser:
        return re.sub(r"([._])", r"\1<wbr>", escape(name))
    if line_chars is None or len(name) <= line_chars:
        return escape(name)
    lines = [""]
    for part in re.split(r"(?<=\.)", name):
        if lines[-1] and len(lines[-1]) + len(part) > line_chars:
            lines.append("")
        lines[-1] += part
    return "<br/>".join(escape(line) for line in lines)


_FOLDED = re.compile(r"^(?:[^–]*\.)?(?P<container>[^.–]+)\.(?P<first>\d+)–(?P<last>\d+)(?:\.(?P<inner>[^–]+))? ×\d+$")


def _fold_example(label: str) -> str:
    """What a folded row of this model stands for, in words: '<i>layers.0–79.mlp ×80</i> is the <i>mlp</i> of
    layers 0 to 79'."""
    m = _FOLDED.match(label)
    if m is None:  # folded over more than one container's index
        return f"<i>{escape(label)}</i> is modules alike but for their indices"
    which = f"{escape(m['container'])} {m['first']} to {m['last']}"
    return f"<i>{escape(label)}</i> is " + (f"the <i>{escape(m['inner'])}</i> of {which}" if m["inner"] else which)


class _Table:
    """A table whose header repeats on every page it spans (QTextDocument honours <thead>)."""

    def __init__(self, headers: list[str], align: str, *, small: bool = False, widths: list[int | None] | None = None):
        self.headers, self.align, self.small, self.widths = headers, align, small, widths
        self.rows: list[tuple[list[str], dict[str, bool]]] = []

    def add(self, cells: list[str], *, bold: bool = False, raw: bool = False) -> None:
        self.rows.append(([c if raw else escape(c) for c in cells], {"bold": bold}))

    def html(self) -> str:
        size = ' style="font-size: 8pt;"' if self.small else ""
        out = [f'<table width="100%" cellspacing="0" cellpadding="3" border="0"{size}><thead><tr>']
        for i, h in enumerate(self.headers):
            a = "right" if self.align[i] == "r" else "left"
            w = f' width="{self.widths[i]}%"' if self.widths and self.widths[i] else ""
            out.append(f'<th align="{a}" bgcolor="{_HEAD_BG}"{w}>{escape(h)}</th>')
        out.append("</tr></thead><tbody>")
        for n, (cells, opt) in enumerate(self.rows):
            bg = f' bgcolor="{_ALT_BG}"' if n % 2 else ""
            out.append(f"<tr{bg}>")
            for i, c in enumerate(cells):
                a = "right" if self.align[i] == "r" else "left"
                c = f"<b>{c}</b>" if opt["bold"] else c
                if a == "right":  # figures stay on one line: Qt's PDF layout ignores nowrap, not &nbsp;
                    c = _NO_BREAK_SPACE.sub("&nbsp;", c)
                    out.append(f'<td align="{a}" nowrap>{c}</td>')
                else:
                    out.append(f'<td align="{a}">{c}</td>')
            out.append("</tr>")
        out.append("</tbody></table>")
        return "".join(out)


def _kv_table(pairs: list[tuple[str, str]], raw_values: bool = False) -> str:
    out = ['<table width="100%" cellspacing="0" cellpadding="3" border="0">']
    for n, (k, v) in enumerate(pairs):
        bg = f' bgcolor="{_ALT_BG}"' if n % 2 else ""
        out.append(f'<tr{bg}><td width="32%"><b>{escape(k)}</b></td><td>{v if raw_values else escape(v)}</td></tr>')
    out.append("</table>")
    return "".join(out)


def _kv_table2(pairs: list[tuple[str, str]]) -> str:
    """Two key/value pairs per row: the configuration stays short enough to share page 1."""
    out = ['<table width="100%" cellspacing="0" cellpadding="3" border="0">']
    for n in range(0, len(pairs), 2):
        bg = f' bgcolor="{_ALT_BG}"' if (n // 2) % 2 else ""
        cells = "".join(
            f'<td width="24%"><b>{escape(k)}</b></td><td width="26%">{escape(v)}</td>' for k, v in pairs[n : n + 2]
        )
        out.append(f"<tr{bg}>{cells}</tr>")
    out.append("</table>")
    return "".join(out)


def _verdict(s: dict[str, Any]) -> str:
    if s.get("fits") is None:
        return ""
    name = escape(s.get("gpu_name") or "the target GPU")
    # The margin is counted from what a process can allocate (the card less the driver's reserve), as the app's
    # gauge says; the card's total beside it made "80.00 GiB with 78.27 GiB to spare" of a 1.09 GiB step.
    usable = s.get("gpu_usable_bytes")
    total = f"{fmt_bytes(usable)} usable" if usable else fmt_bytes(s.get("gpu_total_bytes"))
    margin = s.get("margin_bytes")
    verdict = s.get("verdict")
    if verdict == "tight":
        text = f"Tight on {name} ({total}): {escape(s.get('verdict_reason') or '')}."
        color = _WARN
    elif s["fits"]:
        text = f"Fits on {name} ({total}) with {fmt_bytes(margin)} to spare."
        color = _GOOD
    else:
        text = f"Does not fit on {name} ({total}): {fmt_bytes(-margin if margin is not None else None)} short."
        color = _BAD
    return f'<p style="font-size: 11pt;"><b><span style="color: {color};">{text}</span></b></p>'


def report_markup(facts: Facts, *, chart: Callable[[str, float, float], str], text_width_px: float,
                  browser: bool, name_chars: int | None = None) -> str:
    """`name_chars`: the PDF's module names broken after a dot into lines of at most this many characters."""
    f = facts
    s = f["summary"]
    w = min(text_width_px, 720.0)
    parts: list[str] = []
    add = parts.append
    if browser:
        add(f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{escape(f['title'])}</title>")
        add(f"<style>{BROWSER_CSS}</style></head><body>")

    def h2(text: str) -> None:
        # No forced page breaks: the PDF keeps each heading with what follows it (pdf.keep_headings_with_next).
        add(f"<h2>{escape(text)}</h2>")

    # 1. Title and configuration
    add(f"<h1>{escape(f['title'])}</h1>")
    add(
        f'<p class="muted"><span style="color: #5A5A5A;">Generated {escape(f["generated"].replace("T", " "))} '
        f"by VRAMScope {escape(f['vramscope_version'])} · method: {escape(f['method']['source'])}</span></p>"
    )
    h2("Configuration")
    add(_kv_table2([(r["name"], r["value"]) for r in f["config"]]))

    # 2. Summary
    h2("Summary")
    pairs = [
        (
            "Peak allocated" + (" (per GPU)" if s.get("world_size", 1) > 1 else ""),
            f"<b>{format_bytes(s['peak_allocated_bytes'])}</b> ({_count(s['peak_allocated_bytes'])} bytes) — "
            f"{escape(s['peak_phase'])} of step {s['peak_step']}, in {escape(s['peak_module'])} "
            f"({escape(s['peak_op'])})",
        ),
        ("Parameters", f"{_count(s['parameters'])} ({_count(s['trainable_parameters'])} trainable)"),
    ]
    if "reserved_bytes" in s:
        real = f["method"]["source"] == "snapshot"  # measured on the run's GPU, not predicted
        pairs.append(("Reserved" if real else "Predicted reserved",
                      f"{format_bytes(s['reserved_bytes'])} (its peak, {s['segments']} segments"
                      + (f", at {escape(s['reserved_peak_at'])})" if s["reserved_peak_at"] else ")")))
        if s["reserved_at_live_peak_bytes"]:
            pairs.append(("At the live peak",
                          f"{format_bytes(s['reserved_at_live_peak_bytes'])} reserved, "
                          f"{format_bytes(s['cached_free_bytes'])} of it cached free blocks"
                          + (f" ({escape(s['live_peak_at'])})" if s["live_peak_at"] else "")))
        if s["nvidia_smi_bytes"]:
            pairs.append(("Predicted nvidia-smi", f"{format_bytes(s['nvidia_smi_bytes'])} (CUDA context "
                          f"{format_bytes(s['cuda_context_bytes'])}, workspaces {format_bytes(s['workspace_bytes'])})"))
        if s.get("nvidia_smi_high_bytes"):
            pairs.append(("nvidia-smi range", f"{format_bytes(s['nvidia_smi_low_bytes'])} – "
                          f"{format_bytes(s['nvidia_smi_high_bytes'])} (measured {format_bytes(s['measured_bytes'])}, "
                          f"modelled {format_bytes(s['modelled_bytes'])})"))
        if s.get("gpu_name"):
            usable = f", {fmt_bytes(s['gpu_usable_bytes'])} usable" if s.get("gpu_usable_bytes") else ""
            pairs.append(("Target GPU", f"{escape(s['gpu_name'])} ({fmt_bytes(s.get('gpu_total_bytes'))}{usable})"))
        if s.get("assumed_gpu"):
            pairs.append(("Figures assume", escape(s["assumed_gpu"])))
    pairs.append(
        ("Largest batch that fits",
         str(s["max_batch"]) if s["max_batch"] is not None
         else f"none — {escape(s['max_batch_none'])}" if s.get("max_batch_none") else "not computed for this report")
    )
    add(_kv_table(pairs, raw_values=True))
    add(_verdict(s))

    # 3. Breakdown at the peak
    h2("Breakdown at the peak")
    add(chart("donut", w, 210))
    add(_breakdown_table(f["breakdown"], "Share of peak"))
    if f.get("gpu_breakdown"):
        add(
            "<p>On the GPU, what nvidia-smi would show at the live peak, where memory is tightest: the tensors alive"
            " at that instant, the library workspaces, what the caching allocator holds beyond them (rounding, cached"
            " free blocks) and the CUDA context.</p>"
        )
        add(_breakdown_table(f["gpu_breakdown"], "Share"))

    # 4. Timeline
    h2("Timeline")
    add(chart("timeline", w, 330))
    add(
        '<p>Live bytes by category through the two training steps: the first allocates the optimizer state, '
        "the second is the steady state. Shaded bands mark setup, forward, backward and the optimizer step.</p>"
    )

    # 6. Recommendations (kept beside the timeline: together they answer "why, and what to do")
    h2("Recommendations")
    recs = f["recommendations"]
    if recs is None:
        add("<p>No recommendations were computed for this report (run <i>vramscope plan</i> to get them).</p>")
    elif not recs:
        add("<p>The planner had no recommendation for this configuration.</p>")
    else:
        t = _Table(["#", "Recommendation", "Saves", "Peak after"], "lllr", widths=[4, 64, 16, 16])
        t.align = "llrr"
        for i, r in enumerate(recs, 1):
            text = f"<b>{escape(r['title'])}</b>" + (f"<br/>{escape(r['detail'])}" if r["detail"] else "")
            if r.get("cost"):
                text += f'<br/><span style="color: #5A5A5A;">Cost: {escape(r["cost"])}</span>'
            after = fmt_bytes(r["new_peak_bytes"]) + (
                '<br/><span style="color: #B3261E;">does not fit</span>' if r.get("fits") is False else "")
            t.rows.append(([str(i), text, fmt_bytes(r["saves_bytes"]), after], {"bold": False}))
        add(t.html())

    # 5. Per layer
    pm = f["per_module"]
    h2("Per layer")
    folded = sum(r["count"] for r in pm["top"] if r["count"] > 1)
    example = next((_fold_example(r["name"]) for r in pm["top"] if r["count"] > 1), "")
    add(
        f"<p>The {len(pm['top'])} largest holders of memory at the peak"
        + (f", and the other {pm['rest']['count']} modules summed" if pm["rest"] else "")
        + (f". Blocks a model repeats fold into one row with their figures summed: {example} ({folded} modules are"
           " folded here)" if folded else "")
        + ". Each module counts its own tensors, not its children's: its weights, their gradients (Grads) and"
        " optimizer state (Optim.), and the activations it saved that are still alive at the peak (Acts).</p>"
    )
    # The type goes under the name, so that nine columns fit the page without breaking a name or a figure.
    t = _Table(
        ["Module", "Params", "Weights", "Grads", "Optim.", "Acts", "At peak", "Share"],
        "lrrrrrrr",
        small=True,
    )
    for r in pm["top"] + ([pm["rest"]] if pm["rest"] else []):
        if r is pm["rest"]:
            name = f"<b>{escape(r['name'])}</b>"  # bold figures would not fit their columns
        else:
            name = (_breakable(r["name"], browser, name_chars)
                    + f'<br/><span style="color: #5A5A5A;">{escape(r["type"])}</span>')
        t.add(
            [
                name,
                _count(r["parameters"]),
                format_bytes(r["parameter_bytes"]),
                format_bytes(r["gradient_bytes"]),
                format_bytes(r["optimizer_bytes"]),
                format_bytes(r["activation_bytes"]),
                format_bytes(r["bytes_at_peak"]),
                _pct(r["share_of_peak"]),
            ],
            raw=True,
        )
    add(t.html())

    # 7. Estimate against measurement
    h2("Estimate and measurement")
    cmp_ = f["comparison"]
    if cmp_ is None:
        add("<p>No measurement was attached. <i>vramscope profile</i> runs the step for real and measures it.</p>")
    else:
        add(f"<p>Measured by <b>{escape(cmp_['source'])}</b>; error = estimate − measured.</p>")
        if cmp_.get("against_step"):
            add(f"<p>The real run is compared with the estimate of the step its snapshot shows "
                f"({escape(cmp_['against_step'])}); the figures above are of the configuration chosen.</p>")
        if cmp_.get("against_device"):
            add(f"<p>The run was on the {escape(cmp_['against_device']).upper()}, not the target, so it is compared"
                f" with the estimate for the {escape(cmp_['against_device']).upper()}: the same step with that"
                " device's kernels. The figures above are the target's.</p>")
        t = _Table(["Figure", "Estimate", "Measured", "Error", "Error %"], "lrrrr", widths=[36, 16, 16, 16, 16])
        for r in cmp_["rows"] + cmp_["by_category"]:
            t.add(
                [r["figure"], format_bytes(r["estimate_bytes"]), format_bytes(r["measured_bytes"]),
                 format_bytes(r["error_bytes"]), _signed_pct(r["error_relative"])],
                bold=r in cmp_["rows"][:1],
            )
        add(t.html())
    rr = f.get("real_run")
    if rr:
        add(_real_run_html(rr))
    if f["gpu_snapshot"]:
        add("<h3>GPU snapshot</h3>")
        add(_snapshot_html(f["gpu_snapshot"]))

    # 8. Method and versions
    m = f["method"]
    h2("Method")
    add(f"<p>{escape(m['how'])}</p><p>{escape(m['peak'])}</p>")
    if m["gpu"]:
        add(f"<p>{escape(m['gpu'])}</p>")
    add(f"<p>{escape(m['units'])}</p>")
    t = _Table(["Category", "What it holds"], "ll", widths=[28, 72])
    for c in m["categories"]:
        t.add([c["label"], c["meaning"]])
    add(t.html())
    if m["notes"]:
        add("<h3>Notes from the engine</h3><ul>" + "".join(f"<li>{escape(n)}</li>" for n in m["notes"]) + "</ul>")
    add("<h3>Versions</h3>")
    add(_kv_table(list(f["versions"].items())))
    if browser:
        add("</body></html>")
    return "\n".join(parts)


def _cell(key: str, v: object) -> str:
    if isinstance(v, bool) or v is None:
        return "–" if v is None else ("yes" if v else "no")
    if isinstance(v, int) and "bytes" in key.lower():
        return format_bytes(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list, tuple)):
        return "…"
    return str(v)


def _label(key: str) -> str:
    """A snapshot key as a heading: memory_used_bytes → memory used, utilization_percent → utilization %."""
    for suffix, unit in (("_bytes", ""), ("_percent", " %"), ("_c", " °C")):
        if key.endswith(suffix):
            key = key[: -len(suffix)] + unit
    return key.replace("_", " ")


def _snapshot_html(snap: dict[str, Any]) -> str:
    """A monitor snapshot of unknown depth: scalars as a key/value table, lists of records as tables."""
    out = []
    scalars = [(_label(k), _cell(k, v)) for k, v in snap.items() if not isinstance(v, (dict, list, tuple))]
    if scalars:
        out.append(_kv_table(scalars))
    for k, v in snap.items():
        if isinstance(v, dict):
            rows = [(_label(kk), _cell(kk, vv)) for kk, vv in v.items()]
            out.append(f"<p><b>{escape(_label(k))}</b></p>" + _kv_table(rows))
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, dict) for x in v):
            cols: list[str] = []
            for rec in v:
                cols += [c for c, val in rec.items() if c not in cols and not isinstance(val, (dict, list, tuple))]
            cols = cols[:8]
            t = _Table([_label(c) for c in cols], "l" * len(cols), small=True)
            for rec in v:
                t.add([_cell(c, rec.get(c)) for c in cols])
            out.append(f"<p><b>{escape(_label(k))}</b></p>" + t.html())
    return "".join(out)


def _real_run_html(rr: dict[str, Any]) -> str:
    """A memory snapshot's findings: the file, its segments and, when it was dumped at one, the OOM error."""
    seg = rr["segments"]
    out = [f"<h3>Real run: {escape(str(rr['path']))}</h3>",
           _kv_table([
               ("Events", f"{_count(rr['events'])} ({_count(rr['allocations'])} allocations)"),
               ("Peak of live tensors", format_bytes(rr["peak_bytes"])),
               ("Reserved (max)", fmt_bytes(rr["reserved_bytes"])),
               ("Segments at the dump", f"{seg['count']}: {fmt_bytes(seg['reserved_bytes'])} reserved, "
                f"{fmt_bytes(seg['free_bytes'])} free inside them (largest free block "
                f"{fmt_bytes(seg['largest_free_block'])})"),
           ])]
    oom = rr.get("oom")
    if oom:
        out.append(f"<p><b>Out of memory:</b> {escape(oom['message'])}.</p>")
        t = _Table(["Live when it failed", "Bytes"], "lr", widths=[60, 40])
        for cat, v in sorted(oom["live_by_category"].items(), key=lambda kv: -kv[1]):
            t.add([escape(cat), format_bytes(v)])
        out.append(t.html())
        if oom["stack"]:
            out.append("<p>Stack of the failed allocation (innermost first):<br/>"
                       + "<br/>".join(escape(x) for x in oom["stack"][:12]) + "</p>")
    return "".join(out)
