"""VRAMScope's engine: pure Python + torch, never Qt. Everything the app knows is computed here."""

import os as _os

# The profiler's C++ side (kineto) prints a line per start/stop unless told not to; set before torch loads.
_os.environ.setdefault("KINETO_LOG_LEVEL", "5")

__version__ = "0.1.0"
