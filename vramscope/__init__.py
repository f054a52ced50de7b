"""VRAMScope's public Python API: estimate the memory of a model you hold or of your own training step, compare two
estimates (a memory guard for CI), and record a real run (see README.md, "In your own code")."""

from engine import __version__
from engine.errors import UserError
from engine.results import Estimate
from engine.snapshot_record import record

from .model import estimate, fake

__all__ = ["Estimate", "UserError", "__version__", "estimate", "fake", "record"]
