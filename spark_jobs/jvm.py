"""The locked JVM pieces: jars fetched from Maven Central by ``infra/setup.sh`` into ``.jvm/<set>/``
and checked against ``infra/jvm/jars.sha256``. Two sets, never mixed on one classpath:

- ``spark``: Delta's Spark integration and Spark's Kafka connector, on every Spark session's and
  every ``spark-submit``'s ``spark.jars`` (nothing resolves jars at run time);
- ``kafka``: the embedded KRaft broker (``lake kafka start``).

Which jars belong to a set is read from the checksum list, so a stray jar in ``.jvm/`` is never loaded.
"""

from __future__ import annotations

from pathlib import Path

from spark_jobs.errors import UserError

REPO = Path(__file__).resolve().parent.parent
JVM_DIR = REPO / ".jvm"
JAR_LOCK = REPO / "infra" / "jvm" / "jars.sha256"


def locked_jars(group: str) -> list[Path]:
    """The jars of ``group`` (``spark`` or ``kafka``), in a stable order; a clear error when setup has
    not fetched them."""
    try:
        lines = JAR_LOCK.read_text().splitlines()
    except OSError:
        raise UserError(f"{JAR_LOCK}: the JVM lock is missing (is this a checkout of the product?)") from None
    names = sorted(line.split()[1] for line in lines if line.strip())
    jars = [JVM_DIR / name for name in names if name.startswith(f"{group}/")]
    if not jars:
        raise UserError(f"{JAR_LOCK}: no jars locked for '{group}'")
    missing = [j.name for j in jars if not j.is_file()]
    if missing:
        raise UserError(
            f"{JVM_DIR / group}: {len(missing)} locked jar(s) missing (e.g. {missing[0]}); run 'make setup'"
        )
    return jars
