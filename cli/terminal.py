"""Text the CLI writes to a terminal: names and labels from files, servers and users (model names, GPU names, layer
names and frames from snapshots, Prometheus labels, process commands, file names) cannot move the cursor,
recolour, clear the screen or forge a line of output.

`shown(value)` is a field, through the engine's one sanitizer (engine.core.errors.printable, uncut): every control
character written escaped (`\\n`, `\\x1b`, `\\u202e`), so a name is one line, as it was given. `terminal_text(block)`
is a whole rendered block: its own line breaks and tabs stay, every other control character is escaped (a field
that missed `shown` still cannot send an escape sequence). `say(block)` prints a block so.
"""

from __future__ import annotations

import sys
from typing import TextIO

from engine.core.errors import printable


def shown(value: object) -> str:
    """`value` as one line for a terminal: every control character (newlines too) escaped."""
    return printable(value, None)


def terminal_text(block: str) -> str:
    """A rendered block for a terminal: its newlines and tabs kept, every other control character escaped."""
    if block.isprintable():
        return block
    return "\n".join("\t".join(shown(part) for part in line.split("\t")) for line in block.split("\n"))


def say(block: str = "", file: TextIO | None = None, *, flush: bool = False) -> None:
    """print(), through terminal_text."""
    print(terminal_text(block), file=file if file is not None else sys.stdout, flush=flush)
