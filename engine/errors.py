"""The one exception type a user can cause: a one-line message naming the place and the fix."""


class UserError(Exception):
    """A mistake in what the user gave (file, field, model, option). `str(err)` is the whole message."""

    def __init__(self, message: str, *, where: str | None = None):
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class Cancelled(Exception):
    """Raised inside a long engine job when its cancel token is set."""


def printable(text: object, limit: int = 120) -> str:
    """`text` safe in a one-line message: control characters (escape sequences, newlines) shown escaped, cut
    to `limit` characters."""
    s = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text))
    return s if len(s) <= limit else s[:limit - 1] + "…"
