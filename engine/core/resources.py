"""Where resources/ (icons, stylesheet, templates, GPU catalogue) lives: the source checkout, or a PyInstaller bundle.

One place for this so the engine and the GUI agree, and a frozen build finds its data in sys._MEIPASS.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The checkout's root: as many folders up from this file as its module name has parts (engine.core.resources is
# engine/core/resources.py), so it stays right wherever the module sits inside engine/.
SOURCE_ROOT = Path(__file__).resolve().parents[len(__name__.split(".")) - 1]


def resources_root() -> Path:
    """The resources/ folder: inside the bundle when frozen (sys._MEIPASS), else next to engine/ in the checkout."""
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        frozen = Path(bundle) / "resources"
        if frozen.is_dir():
            return frozen
    return SOURCE_ROOT / "resources"


def resource_path(*parts: str) -> Path:
    """A path under resources/, e.g. resource_path("templates", "mlp.json"); it need not exist."""
    return resources_root().joinpath(*parts)
