"""The one exception type for mistakes a user can fix (bad input, unknown names, bad config), and
how an error of the environment is told from a bug.

The CLI prints a :class:`UserError` as a single line and exits non-zero; so it does a storage that
cannot be written (:func:`storage_reason`); anything else is a bug and keeps its traceback.
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


# What the JVM (Spark, Delta, Hadoop's local file system) says when a write fails for the storage's
# sake, not the program's: the same errno texts as Python's OSError, inside a Java exception's chain
STORAGE_ERRORS = {
    "No space left on device": "no space left on the device",
    "Disk quota exceeded": "the disk quota is used up",
    "File too large": "the file would be larger than this process may write",
    "Read-only file system": "the file system is read-only",
}


def storage_reason(exc: BaseException) -> str | None:
    """Why a Spark write failed when the cause is the storage under it (a full disk, a read-only
    file system), else None. The reason sits anywhere in the Java exception's chain of causes, which
    PySpark puts in the Python exception's text."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        for marker, reason in STORAGE_ERRORS.items():
            if marker in text:
                return reason
        current = current.__cause__ or current.__context__
    return None
