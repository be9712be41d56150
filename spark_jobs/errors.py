"""The one exception type for mistakes a user can fix (bad input, unknown names, bad config).

The CLI prints it as a single line and exits non-zero; anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem in what the user asked for or fed in; ``str(err)`` is the whole message."""

    exit_code = 2


def spark_error(exc: BaseException) -> str:
    """The first meaningful line of a Spark error (analysis, parse or run time), without its SQL
    position, SQLSTATE and the advice to use a ``try_`` function that follow it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text.split("; line ")[0].split(" SQLSTATE")[0].split(" Use `try_")[0].strip()
