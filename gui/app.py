"""The application shell: QApplication set-up (high DPI, light/dark palette following the system, stylesheet,
icon, QSettings identity), the headless `--screenshot PATH` run, and a clean end on SIGTERM/SIGINT/SIGHUP.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from PySide6.QtCore import QSettings, QSocketNotifier, Qt, QTimer
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPalette
from PySide6.QtWidgets import QApplication, QStyleFactory

from engine import __version__
from engine.core.resources import resource_path
from render.colors import is_dark_palette

from . import qt_workarounds  # noqa: F401 — before any signal is emitted
from .bridge import shutdown_all

ORG = "VRAMScope"
APP = "VRAMScope"
SCREENSHOT_TIMEOUT_S = 120  # the default sketch traces in about a second; this only guards a hung engine
SCREENSHOT_SIZE = (1440, 900)




def system_is_dark(app: QGuiApplication) -> bool:
    """The system's colour scheme (Qt ≥ 6.5), else guess from the default palette.

    VRAMSCOPE_THEME=dark|light overrides it (for a desktop that does not report its scheme).
    """
    forced = os.environ.get("VRAMSCOPE_THEME", "").lower()
    if forced in ("dark", "light"):
        return forced == "dark"
    hints = app.styleHints()
    scheme = getattr(hints, "colorScheme", None)
    if scheme is not None:
        s = scheme()
        if s == Qt.ColorScheme.Dark:
            return True
        if s == Qt.ColorScheme.Light:
            return False
    return is_dark_palette(app.palette())


def dark_palette() -> QPalette:
    p = QPalette()
    base, window, text = QColor("#1e1f22"), QColor("#2b2d30"), QColor("#dfe1e5")
    disabled = QColor("#7a7e85")
    roles = {
        QPalette.ColorRole.Window: window,
        QPalette.ColorRole.WindowText: text,
        QPalette.ColorRole.Base: base,
        QPalette.ColorRole.AlternateBase: QColor("#26282b"),
        QPalette.ColorRole.ToolTipBase: QColor("#3c3f41"),
        QPalette.ColorRole.ToolTipText: text,
        QPalette.ColorRole.PlaceholderText: disabled,
        QPalette.ColorRole.Text: text,
        QPalette.ColorRole.Button: QColor("#393b40"),
        QPalette.ColorRole.ButtonText: text,
        QPalette.ColorRole.BrightText: QColor("#ff6b5a"),
        QPalette.ColorRole.Light: QColor("#4a4d52"),
        QPalette.ColorRole.Midlight: QColor("#3c3f44"),
        QPalette.ColorRole.Mid: QColor("#4e5157"),
        QPalette.ColorRole.Dark: QColor("#18191b"),
        QPalette.ColorRole.Shadow: QColor("#000000"),
        QPalette.ColorRole.Highlight: QColor("#2f65ca"),
        QPalette.ColorRole.HighlightedText: QColor("#ffffff"),
        QPalette.ColorRole.Link: QColor("#589df6"),
    }
    for role, color in roles.items():
        p.setColor(role, color)
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    return p


def light_palette(app: QApplication) -> QPalette:
    p = app.style().standardPalette()
    p.setColor(QPalette.ColorRole.Highlight, QColor("#2f6fdb"))
    p.setColor(QPalette.ColorRole.AlternateBase, QColor("#f4f6f9"))
    return p


def apply_theme(app: QApplication) -> bool:
    """Palette and stylesheet for the system's scheme; returns whether it is dark."""
    dark = system_is_dark(app)
    app.setPalette(dark_palette() if dark else light_palette(app))
    qss = resource_path("style.qss")
    try:
        app.setStyleSheet(qss.read_text(encoding="utf-8"))
    except OSError:
        pass  # an unstyled window still works
    app.setProperty("vramscopeDark", dark)
    return dark


def make_app() -> QApplication:
    existing = QApplication.instance()
    if existing is not None:
        assert isinstance(existing, QApplication), "a QCoreApplication already runs here; the app needs widgets"
        return existing
    # Fractional scale factors (150 %) render crisply instead of being rounded to 1x or 2x.
    QGuiApplication.setHighDpiScaleFactorRoundingPolicy(Qt.HighDpiScaleFactorRoundingPolicy.PassThrough)
    app = QApplication(sys.argv[:1])
    app.setOrganizationName(ORG)
    app.setOrganizationDomain("vramscope.app")
    app.setApplicationName(APP)
    app.setApplicationDisplayName(APP)
    app.setApplicationVersion(__version__)
    app.setDesktopFileName("vramscope")
    if "Fusion" in QStyleFactory.keys():
        app.setStyle("Fusion")  # the same look, and a palette that is honoured, on every platform
    icon = resource_path("icons", "vramscope.svg")
    if icon.exists():
        app.setWindowIcon(QIcon(str(icon)))
    apply_theme(app)
    # PySide6 6.11 destroys QMimeData left on the clipboard twice at exit (a crash on quit); our clipboard
    # holds only copied builder layers, which no other program reads.
    app.aboutToQuit.connect(lambda: app.clipboard().clear() if app.clipboard().ownsClipboard() else None)
    hints = app.styleHints()
    if hasattr(hints, "colorSchemeChanged"):
        hints.colorSchemeChanged.connect(lambda *_: apply_theme(app))
    return app


def end_on_signals(app: QApplication, end: Callable[[], None]) -> None:
    """SIGTERM, SIGINT and SIGHUP end the app cleanly (`end`, then quit), as closing the window does.

    Python runs a signal handler only when the interpreter next gets control, which Qt's event loop never gives
    it: the signal's wake-up byte, written to a socket that Qt watches, hands it control at once."""
    read_end, write_end = socket.socketpair()
    read_end.setblocking(False)
    write_end.setblocking(False)
    signal.set_wakeup_fd(write_end.fileno())
    notifier = QSocketNotifier(read_end.fileno(), QSocketNotifier.Type.Read, app)

    def drain() -> None:
        try:
            read_end.recv(64)
        except OSError:
            pass

    notifier.activated.connect(drain)

    def finish() -> None:
        end()
        app.quit()

    def handler(_signum: int, _frame: FrameType | None) -> None:
        # Through the event loop: a signal during start-up, before exec(), would find no loop to quit.
        QTimer.singleShot(0, finish)

    for name in ("SIGTERM", "SIGINT", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), handler)
    _SIGNAL_KEEP.extend((read_end, write_end, notifier))


_SIGNAL_KEEP: list[object] = []  # the wake-up sockets and their notifier live as long as the app


def run_app(screenshot: str | None = None) -> int:
    """Start the desktop app (blocks until it quits), or render one screenshot headless and exit."""
    app = make_app()
    from .main_window import MainWindow

    if screenshot:
        return _screenshot(app, screenshot)
    shown: list[MainWindow] = []
    # Before the window: it starts the engine's worker processes, which must never outlive a signal.
    def end_shown() -> None:
        for w in shown:
            w.end_session()

    end_on_signals(app, end_shown)
    try:
        window = MainWindow(QSettings())
        shown.append(window)
        window.show()
        if window.document.offer_recovery(window):
            window.show_sketch(window.document.sketch)
        else:
            window.open_default()
    except BaseException:
        shutdown_all()  # a start that fails leaves no engine process, reader thread or resource tracker behind
        raise
    settle_heap()
    return app.exec()


def settle_heap() -> None:
    """Put what start-up made (Qt's wrappers, torch's and the engine's modules: some 500,000 objects) out of the
    garbage collector's reach, once, before the event loop runs: a full collection then walks only what the session
    makes. Without it the collection that unpickling the first estimate set off held the GIL, so the GUI thread,
    for 120-250 ms (benchmarks/app_edit.py: the longest stall from opening 123 ms -> 46 ms; issue 24)."""
    gc.collect()
    gc.freeze()


@dataclass
class _ShotOutcome:
    rc: int = 1
    done: bool = False
    message: str = ""


def _screenshot(app: QApplication, path: str) -> int:
    from .main_window import MainWindow

    # The user's saved layout must not change what a screenshot shows, nor be overwritten by it.
    tmp = tempfile.TemporaryDirectory(prefix="vramscope-shot-")
    settings = QSettings(os.path.join(tmp.name, "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings, restore_state=False)
    window.confirm_close = False
    window.resize(*SCREENSHOT_SIZE)
    window.show()
    outcome = _ShotOutcome()

    def grab(message: str = "") -> None:
        if outcome.done:
            return
        outcome.done = True
        outcome.message = message
        # Let queued repaints (charts, table) land before the grab.
        QTimer.singleShot(400, finish)

    def finish() -> None:
        app.processEvents()
        out = Path(path)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            ok = window.grab().save(str(out), "PNG")
        except OSError as e:
            ok = False
            outcome.message = str(e)
        if ok:
            outcome.rc = 0
        else:
            print(f"error: could not write the screenshot to {out}", file=sys.stderr)
            outcome.rc = 2
        window.close()
        app.quit()

    def start() -> None:
        # open_default falls back to a built-in model, so False means the start page's model failed to open: the
        # window's status bar holds why (the message box is off in this non-interactive run).
        if not window.open_default():
            why = window.statusBar().currentMessage()
            grab(f"the start page's model did not open: {why}" if why else "the start page's model did not open")

    def settled() -> None:
        # The planner's answers too: the window as a user sees it once its work is done (and all it printed).
        if window.estimate is not None and not window.session.is_busy():
            grab()

    window.estimateReady.connect(lambda _est: QTimer.singleShot(0, settled))
    window.session.busyChanged.connect(lambda busy: None if busy else settled())
    window.estimateFailed.connect(grab)
    QTimer.singleShot(SCREENSHOT_TIMEOUT_S * 1000, lambda: grab("timed out waiting for the estimate"))
    QTimer.singleShot(0, start)
    app.exec()
    if outcome.message:
        print(f"warning: {outcome.message}", file=sys.stderr)
    tmp.cleanup()
    return outcome.rc
