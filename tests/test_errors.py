"""How the CLI tells a storage that refused a write from a bug (spark_jobs.errors)."""

from __future__ import annotations

import errno

from spark_jobs.errors import cannot_write, storage_errno


def test_a_storage_error_is_found_anywhere_in_the_chain_of_causes():
    java = RuntimeError(
        "An error occurred while calling o87.save.\n: org.apache.spark.SparkException: Job aborted.\n"
        "Caused by: java.io.IOException: No space left on device\n\tat java.base/..."
    )
    try:
        try:
            raise java
        except RuntimeError as inner:
            raise ValueError("the batch failed") from inner
    except ValueError as outer:
        assert storage_errno(outer) == errno.ENOSPC
    assert storage_errno(OSError("java.nio.file.FileSystemException: Read-only file system")) == errno.EROFS
    assert storage_errno(RuntimeError("Job aborted: division by zero")) is None


def test_one_line_names_the_path_the_reason_and_the_fix():
    assert cannot_write("under /lake", errno.ENOSPC) == (
        "cannot write under /lake: no space left on the device; free space and run the command again"
    )
    assert cannot_write("/lake/x", errno.EROFS) == (
        "cannot write /lake/x: the file system is read-only; give a writable lake root with --root or $LAKE_ROOT"
    )
