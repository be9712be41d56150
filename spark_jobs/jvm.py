"""The locked JVM pieces: jars fetched from Maven Central by ``infra/setup.sh`` into ``.jvm/<set>/``
and checked against ``infra/jvm/jars.sha256``. Two sets, never mixed on one classpath:

- ``spark``: Delta's Spark integration and Spark's Kafka connector, on every Spark session's and
  every ``spark-submit``'s ``spark.jars`` (nothing resolves jars at run time);
- ``kafka``: the embedded KRaft broker (``lake kafka start``).

The joins' state operators (``spark_jobs/joins/java``) are the product's own JVM code: ``infra/setup.sh``
compiles them against the installed pyspark's jars into ``build/jvm/lake-joins.jar``
(:func:`operators_jar`), which goes on every session's ``spark.jars`` with the ``spark`` set.

Which jars belong to a set is read from the checksum list, so a stray jar in ``.jvm/`` is never loaded.
"""

from __future__ import annotations

from pathlib import Path

from spark_jobs.errors import UserError

REPO = Path(__file__).resolve().parent.parent
JVM_DIR = REPO / ".jvm"
JAR_LOCK = REPO / "infra" / "jvm" / "jars.sha256"
OPERATORS_SOURCE = REPO / "spark_jobs" / "joins" / "java"
OPERATORS_JAR = REPO / "build" / "jvm" / "lake-joins.jar"


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


def operators_jar() -> Path:
    """The jar of the joins' state operators; a clear error when setup has not built it, or built it
    from older sources."""
    if not OPERATORS_JAR.is_file():
        raise UserError(f"{OPERATORS_JAR}: the join operators are not built; run 'make setup'")
    built = OPERATORS_JAR.stat().st_mtime
    if any(source.stat().st_mtime > built for source in OPERATORS_SOURCE.rglob("*.java")):
        raise UserError(f"{OPERATORS_JAR}: older than the sources in {OPERATORS_SOURCE}; run 'make setup'")
    return OPERATORS_JAR
