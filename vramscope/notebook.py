"""An Estimate in a Jupyter notebook: the peak, the verdict, the breakdown donut and the timeline as inline images
painted by the report's own painters (report.content.chart_painters), and the modules that hold the most at the peak.
Registered as Estimate's HTML view when vramscope is imported."""

from __future__ import annotations

import base64
from html import escape

from engine.core.units import format_bytes
from engine.results.module_groups import fold_modules
from engine.results.types import Estimate, category_name

CHARTS = {"donut": (560, 210), "timeline": (720, 300)}  # CSS pixels, as the report lays them out; painted at 2x
TOP_MODULES = 8


def chart_png(est: Estimate, name: str, width: int, height: int, scale: int = 2) -> bytes:
    """The report's `name` chart of `est` ("donut" or "timeline") as a PNG of width × height CSS pixels."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QRectF, Qt
    from PySide6.QtGui import QImage, QImageWriter, QPainter

    from report import ensure_gui_application
    from report.content import chart_painters

    ensure_gui_application()
    img = QImage(width * scale, height * scale, QImage.Format.Format_ARGB32)
    img.setDevicePixelRatio(scale)
    img.fill(Qt.GlobalColor.white)
    p = QPainter(img)
    try:
        chart_painters(est)[name](p, QRectF(0, 0, width, height))
    finally:
        p.end()
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    QImageWriter(buf, QByteArray(b"png")).write(img)
    return bytes(data.data())


def _verdict(est: Estimate) -> str:
    g = est.gpu
    if g is None:
        return f"target {escape(est.config.device)}: live tensor bytes only (no GPU figures)"
    parts = [f"<b>{escape(g.gpu_name or 'GPU')}</b>"]
    if g.nvidia_smi_bytes:
        parts.append(f"nvidia-smi {format_bytes(g.nvidia_smi_bytes)}")
    parts.append(f"reserved {format_bytes(g.reserved_bytes)}")
    if g.verdict:
        color = {"fits": "#1a7f37", "tight": "#9a6700"}.get(g.verdict, "#cf222e")
        parts.append(f'<b style="color:{color}">{escape(g.verdict)}</b>'
                     + (f" ({escape(g.verdict_reason)})" if g.verdict_reason else ""))
    return " · ".join(parts)


def estimate_html(est: Estimate) -> str:
    c = est.config
    what = f"your step {est.step.function}" if est.step is not None else f"{c.mode}, batch {c.batch_size}, " \
        f"{c.precision}" + (f", {c.optimizer}" if c.training else "")
    phase = f"step {est.peak_step + 1}, {est.peak_phase}" if est.peak_phase in ("forward", "backward", "optimizer") \
        else est.peak_phase
    rows = "".join(
        f"<tr><td>{escape(category_name(k, c))}</td><td style='text-align:right'>{format_bytes(v)}</td></tr>"
        for k, v in est.breakdown_at_peak.items() if v)
    images = "".join(
        f'<div><img alt="{name}" width="{w}" height="{h}" src="data:image/png;base64,'
        f'{base64.b64encode(chart_png(est, name, w, h)).decode("ascii")}"></div>'
        for name, (w, h) in CHARTS.items())
    mods = "".join(
        f"<tr><td><code>{escape(g.label)}</code></td><td>{escape(g.type)}</td>"
        f"<td style='text-align:right'>{format_bytes(g.bytes_at_peak)}</td>"
        f"<td style='text-align:right'>{100 * g.share_of_peak:.1f} %</td></tr>"
        for g in fold_modules(est.per_module)[:TOP_MODULES])
    return (
        '<div class="vramscope-estimate">'
        f"<div><b>{escape(est.model_name)}</b> — {escape(what)} — {est.parameters:,} parameters</div>"
        f"<div style='font-size:1.3em'>Peak <b>{format_bytes(est.peak_bytes)}</b> "
        f"<span style='font-size:0.75em'>at {escape(phase)}, module <code>{escape(est.peak_module or '(top level)')}"
        f"</code></span></div>"
        f"<div>{_verdict(est)}</div>"
        f"<div>{images}</div>"
        f"<details><summary>At the peak, by category</summary><table>{rows}</table></details>"
        + (f"<table><tr><th>module</th><th>type</th><th>at peak</th><th>share</th></tr>{mods}</table>" if mods else "")
        + "</div>"
    )


Estimate.html_view = estimate_html
