"""The one sanitizer for text the CLI writes to a terminal: names and labels from files, servers and users (model
names, GPU names, layer names and frames from snapshots, Prometheus labels, process commands, file names) cannot
move the cursor, recolour, clear the screen or forge a line of output.

`shown(value)` is a field: every control character is written escaped (`\\n`, `\\x1b`, `\\u202e`), so a name is
always one line, as it was given. `terminal_text(block)` is a whole rendered block: its own line breaks and tabs
stay, every other control character is escaped (a field that missed `shown` can still not send an escape
sequence). `say(block)` prints a block so.
"""

from __future__ import annotations

import sys
import unicodedata
from typing import TextIO

# Unicode's "format" characters that reorder or hide text (bidirectional overrides and isolates, zero-width ones)
# and its line and paragraph separators, beside the C0/C1 control characters and DEL.
_INVISIBLE = {"\u2028", "\u2029", "\u200b", "\u200c", "\u200d", "\u200e", "\u200f", "\ufeff"} | {
    chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _unsafe(ch: str) -> bool:
    return ch in _INVISIBLE or unicodedata.category(ch) == "Cc"


def shown(value: object) -> str:
    """`value` as one line for a terminal: every control character (newlines too) escaped."""
    text = str(value)
    if text.isprintable() and not any(ch in _INVISIBLE for ch in text):
        return text  # the common case, at C speed
    return "".join(_escaped(ch) if _unsafe(ch) else ch for ch in text)


def terminal_text(block: str) -> str:
    """A rendered block for a terminal: its newlines and tabs kept, every other control character escaped."""
    return "\n".join("\t".join(shown(part) for part in line.split("\t")) for line in block.split("\n"))


def say(block: str = "", file: TextIO | None = None, *, flush: bool = False) -> None:
    """print(), through terminal_text."""
    print(terminal_text(block), file=file if file is not None else sys.stdout, flush=flush)
