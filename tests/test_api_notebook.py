"""An Estimate in a notebook: its HTML view (the peak, the verdict, the report's donut and timeline as inline PNGs,
the top modules) executed in a real Jupyter kernel through nbclient, and its one-line repr."""

from __future__ import annotations

import base64
import re
import textwrap
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient
from PySide6.QtGui import QImage
from torch import nn

import vramscope
from engine.core.units import format_bytes
from engine.planning.diff import load_estimate
from vramscope.notebook import CHARTS

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = Path(__file__).parent / "data" / "resnet18-b8-adam.pickle.gz"

CELL = textwrap.dedent("""
    import torch
    from torch import nn
    import vramscope

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 30 * 30, 5))
    est = vramscope.estimate(model, torch.randn(4, 3, 32, 32), gpu="A100 80GB", optimizer="adamw")
    print(est.peak_bytes)
    est
""")


def _pngs(html: str) -> list[QImage]:
    images = []
    for b64 in re.findall(r'src="data:image/png;base64,([^"]+)"', html):
        img = QImage()
        assert img.loadFromData(base64.b64decode(b64), "PNG")
        images.append(img)
    return images


def test_a_notebook_shows_the_estimate_as_html_in_a_real_kernel(qapp):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"import sys; sys.path.insert(0, {str(ROOT)!r})"),
                nbformat.v4.new_code_cell(CELL)]
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = nb.cells[1].outputs
    printed = int(next(o for o in outputs if o.output_type == "stream").text.strip())
    result = next(o for o in outputs if o.output_type == "execute_result")
    html, plain = result.data["text/html"], result.data["text/plain"]
    # the same estimate made here: the kernel's figures are the engine's
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 30 * 30, 5))
    here = vramscope.estimate(model, torch.randn(4, 3, 32, 32), gpu="A100 80GB", optimizer="adamw")
    assert printed == here.peak_bytes
    assert f"Peak <b>{format_bytes(here.peak_bytes)}</b>" in html
    assert here.gpu is not None and f"nvidia-smi {format_bytes(here.gpu.nvidia_smi_bytes)}" in html
    assert ">fits</b>" in html and "<code>3</code>" in html  # the verdict; the Linear holds the most at the peak
    donut, timeline = _pngs(html)
    assert (donut.width(), donut.height()) == tuple(2 * v for v in CHARTS["donut"])
    assert (timeline.width(), timeline.height()) == tuple(2 * v for v in CHARTS["timeline"])
    assert plain == repr(here) and "\n" not in plain


def _distinct_colors(img: QImage) -> int:
    step = 7
    return len({img.pixel(x, y) for x in range(0, img.width(), step) for y in range(0, img.height(), step)})


def test_the_html_of_a_cpu_estimate_a_users_step_and_a_snapshot(qapp):
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 2))
    cpu = vramscope.estimate(model, torch.randn(3, 16), device="cpu")
    html = cpu._repr_html_()
    assert html is not None and "target cpu: live tensor bytes only" in html and "nvidia-smi" not in html
    assert all(_distinct_colors(img) > 5 for img in _pngs(html))  # painted charts, not blank images

    def step(model, opt, x):
        model(x).pow(2).mean().backward()
        opt.step()

    own = vramscope.estimate_step(step, model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(3, 16),
                                  device="cpu")
    assert "your step test_the_html_of_a_cpu_estimate_a_users_step_and_a_snapshot.&lt;locals&gt;.step" in \
        own._repr_html_()
    snap = load_estimate(SNAPSHOT)
    shtml = snap._repr_html_()
    assert f"Peak <b>{format_bytes(snap.peak_bytes)}</b>" in shtml and len(_pngs(shtml)) == 2


@pytest.mark.parametrize("which", ["cpu", "gpu"])
def test_repr_is_one_readable_line(which):
    model = nn.Linear(10, 4)
    opts = {"device": "cpu"} if which == "cpu" else {"gpu": "H100", "optimizer": "sgd"}
    est = vramscope.estimate(model, torch.randn(2, 10), **opts)
    text = repr(est)
    assert "\n" not in text and len(text) < 200
    assert text.startswith(f"<Estimate Linear: peak {format_bytes(est.peak_bytes)} at step ")
    if which == "gpu":
        assert est.gpu is not None and text.endswith(f"H100 80GB: nvidia-smi "
                                                     f"{format_bytes(est.gpu.nvidia_smi_bytes)}, fits>")
