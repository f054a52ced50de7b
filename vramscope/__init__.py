"""VRAMScope's public Python API: estimate the memory of a model you hold or of your own training step, compare two
estimates (a memory guard for CI: see vramscope.testing), and record a real run (see README.md, "In your own code")."""

from engine import __version__
from engine.core.errors import UserError
from engine.planning.diff import EstimateDiff
from engine.results.types import Estimate
from engine.snapshots.record import record

from . import notebook as _notebook, testing  # noqa: F401 - notebook: Estimate's HTML view
from .compare import diff
from .model import estimate, fake
from .step import estimate_step

__all__ = ["Estimate", "EstimateDiff", "UserError", "__version__", "diff", "estimate", "estimate_step", "fake",
           "record", "testing"]
