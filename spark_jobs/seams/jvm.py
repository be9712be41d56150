"""The locked JVM pieces: jars fetched from Maven Central by ``infra/setup.sh`` into ``.jvm/<set>/``
and checked against ``infra/jvm/jars.sha256``. Sets never mixed on one classpath:

- ``spark``: Delta's Spark integration, Spark's Kafka connector and Avro functions, protobuf-java,
  on every Spark session's and every ``spark-submit``'s ``spark.jars`` (nothing resolves jars at run
  time);
- ``kafka``: the embedded KRaft broker (``lake kafka start``);
- ``registry``: the embedded Schema Registry's archive, unpacked by setup (:func:`registry_app`).

The joins' state operators (``spark_jobs/joins/java``), the record formats' decoders
(``spark_jobs/formats/java``) and the seams' own classes (``spark_jobs/seams/java``: the changelog's
writer that the Kafka seam drives on the executors, the Delta log store of ``s3a://`` roots) are the
product's own JVM code: ``infra/setup.sh`` compiles each against the installed pyspark's jars into a
jar of its own under ``build/jvm/`` (:func:`product_jars`), which go on every session's ``spark.jars``
with the ``spark`` set.

Which jars belong to a set is read from the checksum list, so a stray jar in ``.jvm/`` is never loaded.

``infra/setup.sh`` also writes a class-data archive of the Spark driver JVM (:func:`write_class_archive`,
``build/cds/spark-driver.jsa``: Java's AppCDS, the classes a Spark start loads, already parsed and
verified). Every driver JVM maps it (:func:`class_archive_options`) instead of loading those classes
from the jars: a ``lake sql`` on a small lake took 14.7 s and 18 CPU-seconds with it, 20-25 s and
24-30 CPU-seconds without (C1 JIT both).
The JVM checks the archive against its own build and every jar's size and time, and ignores it,
silently, when anything differs (then a start only takes as long as without it).

Every Spark JVM a ``lake`` command launches runs on jemalloc (:data:`ALLOCATOR`, Debian's
``libjemalloc2`` that setup fetches, pinned and checked, into ``build/native/``), preloaded
(:func:`allocator_env`): the joins and the ingest, whether run by hand, by ``lake start`` or by the
pipeline DAG (the DAG's short ``spark-submit`` tasks run on the Airflow worker's allocator). The
joins' state store's RocksDB allocates and frees native memory at a high rate, and glibc's allocator
fragments under it. At 14,000 updates/s for 30 minutes the fk join's process grew from 4.8 to 5.9 GB
on glibc's allocator (+40 MB a minute outside the JVM's own accounts) and held a flat 3.6 GB on
jemalloc, for the same CPU (docs/benchmarks.md, "Steady state"). ``LAKE_MALLOC=glibc`` runs a JVM on
the C library's allocator instead (to compare).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from spark_jobs.errors import UserError

REPO = Path(__file__).resolve().parents[2]
JVM_DIR = REPO / ".jvm"
JAR_LOCK = REPO / "infra" / "jvm" / "jars.sha256"
OPERATORS_SOURCE = REPO / "spark_jobs" / "joins" / "java"
OPERATORS_JAR = REPO / "build" / "jvm" / "lake-joins.jar"
FORMATS_SOURCE = REPO / "spark_jobs" / "formats" / "java"
FORMATS_JAR = REPO / "build" / "jvm" / "formats" / "lake-formats.jar"
SEAMS_SOURCE = REPO / "spark_jobs" / "seams" / "java"
SEAMS_JAR = REPO / "build" / "jvm" / "seams" / "lake-seams.jar"
CLASS_ARCHIVE = REPO / "build" / "cds" / "spark-driver.jsa"
ALLOCATOR = REPO / "build" / "native" / "libjemalloc.so.2"
# the JVM's own notices about the archive (one it cannot use is ignored: nothing to tell a user)
_QUIET_ARCHIVE = "-Xlog:cds=off -Xlog:cds+dynamic=off"


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


def registry_app() -> Path:
    """The embedded Schema Registry's runnable jar (Apicurio Registry, unpacked by setup from its
    locked archive); a clear error when setup has not unpacked it."""
    found = sorted((JVM_DIR / "registry" / "app").glob("apicurio-registry-app-*-runner.jar"))
    if not found:
        raise UserError(
            f"{JVM_DIR / 'registry' / 'app'}: the Schema Registry is not unpacked; run 'make setup'"
        )
    return found[-1]


def product_jars() -> list[Path]:
    """The product's own JVM code, built by setup: the joins' state operators, the record formats'
    decoders, the Kafka seam's changelog writer and the log store of Delta on ``s3a://``; a clear
    error when setup has not built a jar, or built it from older sources."""
    return [
        _built(OPERATORS_JAR, OPERATORS_SOURCE, "the join operators"),
        _built(FORMATS_JAR, FORMATS_SOURCE, "the record format decoders"),
        _built(SEAMS_JAR, SEAMS_SOURCE, "the changelog writer and the Delta log store"),
    ]


def _built(jar: Path, sources: Path, what: str) -> Path:
    if not jar.is_file():
        raise UserError(f"{jar}: {what} are not built; run 'make setup'")
    built = jar.stat().st_mtime
    if any(source.stat().st_mtime > built for source in sources.rglob("*.java")):
        raise UserError(f"{jar}: older than the sources in {sources}; run 'make setup'")
    return jar


def class_archive_options(jvm_options: str) -> str:
    """The driver JVM options that map the class-data archive, when setup wrote it (none while an
    archive is being written: ``-XX:ArchiveClassesAtExit`` in ``jvm_options``)."""
    if "ArchiveClassesAtExit" in jvm_options or not CLASS_ARCHIVE.is_file():
        return ""
    return f"-XX:SharedArchiveFile={CLASS_ARCHIVE} {_QUIET_ARCHIVE}"


def allocator_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a JVM that runs on jemalloc: :data:`ALLOCATOR` first in ``LD_PRELOAD`` (a preload
    of the caller's own kept after it). Unchanged when setup did not fetch it (not an amd64 Debian
    machine) or ``LAKE_MALLOC=glibc``."""
    preload = env.get("LD_PRELOAD", "")
    if env.get("LAKE_MALLOC") == "glibc" or not ALLOCATOR.is_file() or str(ALLOCATOR) in preload:
        return dict(env)
    return {**env, "LD_PRELOAD": f"{ALLOCATOR} {preload}".strip()}


def write_class_archive(path: Path = CLASS_ARCHIVE) -> None:
    """Start Spark as every command does, run a small Delta and streaming workload (the classes a
    command loads), and let the JVM write the classes it loaded to ``path`` as it exits."""
    import os
    import subprocess
    import sys
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    env = {**os.environ}
    jvm = env.get("LAKE_JVM_OPTS", "-XX:+UseParallelGC")
    env["LAKE_JVM_OPTS"] = f"{jvm} -XX:ArchiveClassesAtExit={partial} {_QUIET_ARCHIVE}"
    with tempfile.TemporaryDirectory(prefix="lake-class-archive-") as work:
        done = subprocess.run(
            [sys.executable, "-c", _WORKLOAD, work], env=env, capture_output=True, text=True, timeout=600
        )
    if done.returncode != 0 or not partial.is_file():
        raise UserError(f"could not write the class-data archive {path}: {done.stderr.strip()[-2000:]}")
    partial.replace(path)


# Run in a child process, so the JVM exits (and writes the archive) before write_class_archive returns.
_WORKLOAD = """
import sys
from pathlib import Path

from pyspark import SparkContext

from spark_jobs.seams.session import get_spark

work = sys.argv[1]
spark = get_spark(app_name="lake-class-archive", catalog=Path(work))  # with the catalog, as lake sql
table = f"{work}/t"
spark.range(100).selectExpr("id", "cast(id as string) AS v").write.format("delta").save(table)
spark.sql(f"MERGE INTO delta.`{table}` t USING (SELECT 1L AS id, 'x' AS v) s ON t.id = s.id "
          "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
spark.read.format("delta").load(table).groupBy("v").count().collect()
spark.sql(f"CREATE TABLE managed USING delta AS SELECT * FROM delta.`{table}`")
spark.sql("SELECT count(*) FROM managed").collect()
spark.createDataFrame([(1, "a")], "k int, v string").toPandas()
stream = (spark.readStream.format("delta").load(table).writeStream
          .foreachBatch(lambda frame, _: frame.count())
          .option("checkpointLocation", f"{work}/checkpoint").trigger(availableNow=True).start())
stream.awaitTermination()
proc = SparkContext._gateway.proc
spark.stop()
proc.stdin.close()  # the JVM exits at the end of its input, writing the archive
proc.wait()
"""
