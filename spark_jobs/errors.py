"""The one exception type for mistakes a user can fix (bad input, unknown names, bad config), and
how an error of the environment is told from a bug.

The CLI prints a :class:`UserError` as a single line and exits non-zero; so it does a storage that
cannot be written (:func:`storage_errno`); anything else is a bug and keeps its traceback.
"""

import errno
import os


class UserError(Exception):
    """A problem in what the user asked for or fed in; ``str(err)`` is the whole message."""

    exit_code = 2


def spark_error(exc: BaseException) -> str:
    """The first meaningful line of a Spark error (analysis, parse or run time), without its SQL
    position, SQLSTATE and the advice to use a ``try_`` function that follow it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text.split("; line ")[0].split(" SQLSTATE")[0].split(" Use `try_")[0].strip()


# Why a write under the lake root failed when the storage refused it, not the program, by errno
FILE_SYSTEM = {
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file would be larger than this process may write",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
}
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def cannot_write(where: str, code: int) -> str:
    """One line for a path the command cannot write: which, why, and what to do."""
    fix = (
        "free space and run the command again"
        if code in FULL
        else "give a writable lake root with --root or $LAKE_ROOT"
    )
    return f"cannot write {where}: {FILE_SYSTEM[code]}; {fix}"


def storage_errno(exc: BaseException) -> int | None:
    """The errno of a Spark write that failed for the storage under it (a full disk, a read-only file
    system), else None. The JVM (Spark, Delta, Hadoop's local file system) says it with the C
    library's text for that errno anywhere in the Java exception's chain of causes, which PySpark puts
    in the Python exception's text."""
    markers = {os.strerror(code): code for code in (*FULL, errno.EROFS)}
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        for marker, code in markers.items():
            if marker in text:
                return code
        current = current.__cause__ or current.__context__
    return None
