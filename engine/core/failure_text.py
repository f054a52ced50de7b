"""The one line a user sees when an engine job fails (the app's status bar and panels): a UserError's own text;
any other failure names what was being read (the snapshot file, the model or config) and says what went wrong in
words, never an exception's repr (`KeyError: 'frames'`, `<object at 0x7f…>`)."""

from __future__ import annotations

import re

from .errors import UserError, printable

MAX_CHARS = 300
_REPR = re.compile(r"<[^<>]* at 0x[0-9a-fA-F]+>")  # <function f at 0x7f...>, <Foo object at 0x...>


def _plain(exc: BaseException) -> str:
    """The exception's text on one line, any object's repr in it as 'an object'."""
    return _REPR.sub("an object", " ".join(str(exc).split()))


def failure_detail(exc: BaseException) -> str:
    """What went wrong, in words: a phrase for a message that has already named the file."""
    if isinstance(exc, KeyError):
        key = exc.args[0] if exc.args else "?"
        return f"the field '{printable(key, 60)}' it needs is missing"
    if isinstance(exc, RecursionError):
        return "it is nested too deeply to read"
    if isinstance(exc, OSError):
        return f"it cannot be read ({exc.strerror or 'input/output error'})"
    if isinstance(exc, IndexError):
        return "a list in it is shorter than its other fields say"
    text = _plain(exc)
    kind = ("a field has the wrong type" if isinstance(exc, (TypeError, AttributeError))
            else "a field has a value it cannot take" if isinstance(exc, (ValueError, ArithmeticError))
            else "it could not be read")
    return f"{kind} ({printable(text, 160)})" if text else kind


def failure_text(exc: BaseException, subject: str | None = None) -> str:
    """One line for `exc`, raised while reading or estimating `subject` (a file path or a model's name)."""
    if isinstance(exc, UserError):
        text = str(exc)
    elif isinstance(exc, MemoryError):
        text = "out of host memory while estimating; try a smaller batch or sequence"
    elif subject:
        text = f"{printable(subject, 120)}: {failure_detail(exc)}"
    else:  # a job of no file: what went wrong is all there is to say
        text = f"the engine stopped: {_plain(exc) or 'an internal check failed (the log has the details)'}"
    text = printable(" ".join(text.split()), None)  # one line, whatever the engine wrote
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 1] + "…"
