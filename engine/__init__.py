"""VRAMScope's engine: pure Python + torch, never Qt. Everything the app knows is computed here."""

__version__ = "0.1.0"
