"""Grab the builder to PNG with a template loaded — for looking at the cards without a display.

    QT_QPA_PLATFORM=offscreen python -m gui.builder.snapshot resnet18 out.png [--fit] [--select ID] [--dark]
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from .widget import BuilderWidget


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("template")
    ap.add_argument("out")
    ap.add_argument("--size", default="1400x900")
    ap.add_argument("--fit", action="store_true", help="zoom to fit the whole sketch")
    ap.add_argument("--select", default="", help="node id to select (shows it in the inspector)")
    ap.add_argument("--dark", action="store_true")
    ap.add_argument("--zoom", type=float, default=0.0, help="open at this zoom (top of the sketch)")
    ap.add_argument("--field", action="append", default=[], help="ID.FIELD=VALUE set before grabbing")
    ap.add_argument("--center", default="", help="node id to centre the view on")
    ap.add_argument("--batch", type=int, default=32, help="batch size of the engine's analytic figures shown")
    args = ap.parse_args(argv)

    from PySide6.QtGui import QColor, QPalette
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication), "grabbing widgets needs a QApplication, not a QCoreApplication"
    if args.dark:
        app.setStyle("Fusion")
        pal = QPalette()
        for role, colour in ((QPalette.ColorRole.Window, "#2b2d31"), (QPalette.ColorRole.Base, "#1f2125"),
                             (QPalette.ColorRole.Text, "#e6e6e6"), (QPalette.ColorRole.WindowText, "#e6e6e6"),
                             (QPalette.ColorRole.Button, "#2b2d31"), (QPalette.ColorRole.ButtonText, "#e6e6e6"),
                             (QPalette.ColorRole.Highlight, "#3d8fd6")):
            pal.setColor(role, QColor(colour))
        app.setPalette(pal)

    from engine.sketch.document import load_template

    w = BuilderWidget(autosave_dir=tempfile.mkdtemp(prefix="vramscope-snap-"), autosave_interval_s=0)
    width, height = (int(v) for v in args.size.split("x"))
    w.resize(width, height)
    w.set_sketch(load_template(args.template))
    for spec in args.field:
        target, value = spec.split("=", 1)
        nid, field = target.split(".", 1)
        w.sketch().set_field(nid, field, value)
        w.document().changed.emit(w.sketch())
    _show_analytic(w, args.batch)
    w.show()
    for _ in range(3):
        app.processEvents()
    if args.fit:
        w.zoom_to_fit()
    if args.zoom:
        w.canvas().fit_readable(args.zoom)
        w.canvas().zoom_by(args.zoom / w.canvas().zoom())
    if args.select:
        w.select_node(args.select)
    if args.center:
        item = w.canvas().scene_().nodes[args.center]
        w.canvas().centerOn(item)
    app.processEvents()
    ok = w.grab().save(args.out)
    print(args.out if ok else "could not save")
    return 0 if ok else 1


def _show_analytic(w: BuilderWidget, batch: int) -> None:
    """Per-node memory from the engine's analytic estimate, as the main window would deliver it."""
    try:
        from engine.config.train_config import TrainConfig
        from engine.sketch.analytic import analytic

        res = analytic(w.sketch(), TrainConfig(batch_size=batch))
    except Exception as err:  # the snapshot still shows shapes without it
        print(f"no analytic figures: {err}", file=sys.stderr)
        return
    w.set_node_results({nid: {"memory": f.total_bytes, "shape": f.output_shape, "error": f.error,
                              "params": f.parameters} for nid, f in res.nodes.items()})


if __name__ == "__main__":
    raise SystemExit(main())
