"""The one exception type a user can cause: a one-line message naming the place and the fix."""


class UserError(Exception):
    """A mistake in what the user gave (file, field, model, option). `str(err)` is the whole message."""

    def __init__(self, message: str, *, where: str | None = None):
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class Cancelled(Exception):
    """Raised inside a long engine job when its cancel token is set."""


def printable(text: object, limit: int | None = 120) -> str:
    """`text` safe in a one-line message: control characters (escape sequences, newlines, bidirectional
    overrides, line separators) shown escaped, cut to `limit` characters (None: whole). The one sanitizer of
    names in messages; the CLI prints every name through it (cli.terminal)."""
    s = str(text)
    if not s.isprintable():
        s = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in s)
    return s if limit is None or len(s) <= limit else s[:limit - 1] + "…"
