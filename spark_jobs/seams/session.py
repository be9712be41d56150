"""The Spark session seam: the only place a SparkSession is built.

``local[2]`` by default; ``LAKE_SPARK_MASTER`` (or the ``master`` argument) for a real cluster, e.g.
``spark://host:7077``. Under ``spark-submit`` (Airflow's SparkSubmitOperator) the JVM exists already
and the deploy settings it was given (master, app name, driver memory and options) stand.
Few shuffle partitions (``LAKE_SHUFFLE_PARTITIONS``; by default a local master's core count, else
4: a join's result MERGE into a 1M-row table took 1.7 s with 2 partitions on ``local[2]`` and 2.5 s
with 4), UTC session time zone, quiet logs,
UI off unless ``LAKE_SPARK_UI=1``. Every session loads exactly the locked jars (Delta's Spark
integration, Spark's Kafka connector: :mod:`spark_jobs.seams.jvm`) and the joins' state operators, with
Delta's SQL extension and catalog, and Spark's RocksDB state store,
so ``format("delta")``, ``format("kafka")``, Delta SQL (MERGE, time travel, change data feed) work in
every session and every ``spark-submit``. The JVM a session launches runs on jemalloc
(:func:`spark_jobs.seams.jvm.allocator_env`).

What the JVM itself prints (log4j's warnings, a thread pool's Java stack trace while the session
shuts down, the JVM's notices) is not the command's output: the ``lake`` command sends it to
``<root>/_logs/<command>.log`` (a detached job: to the job's log) with :func:`send_jvm_output_to`
before Spark starts, so a command prints only its own lines. A library caller (a test, a notebook)
keeps the JVM on its own stderr.

``catalog=<lake root>`` gives the session a persistent catalog under that root (the marts dbt
builds): a Hive metastore in embedded Derby at ``<root>/catalog/metastore_db`` and managed tables in
``<root>/warehouse``. Embedded Derby admits one process at a time, so only the processes that need
the catalog (``lake dbt``, ``lake sql``) open it; every other job runs on Spark's in-memory catalog.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spark_jobs.errors import UserError
from spark_jobs.layout import Layout
from spark_jobs.seams import fences
from spark_jobs.seams.jvm import allocator_env, class_archive_options, locked_jars, product_jars
from spark_jobs.seams.storage import Root, hadoop_conf

DEFAULT_MASTER = "local[2]"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CODEGEN_CACHE = 2000  # compiled plan classes kept (a join batch's ~145, many joins, Delta's own)
# Settings spark-submit decides for a submitted application; a session built inside one keeps them.
DEPLOY_KEYS = ("spark.master", "spark.app.name", "spark.driver.memory", "spark.driver.extraJavaOptions")
LOG_KEEP_BYTES = 20_000_000  # a JVM log past this size is moved to <log>.1 when the next JVM starts

_jvm_output: Path | None = None  # where the JVM this process starts writes its own output


def send_jvm_output_to(path: Path | None) -> None:
    """Have the JVM that :func:`get_spark` starts in this process write its stdout and stderr to
    ``path`` (appended, after a line naming the command) instead of this process's own. None: the
    process's own (the default). No effect on a JVM already running, nor under spark-submit."""
    global _jvm_output
    _jvm_output = path


def _open_jvm_log(path: Path) -> Any:
    """The log file, opened for appending, or None when it cannot be written (a read-only root: the
    JVM then keeps this process's stderr, and the command's own write reports the root)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size > LOG_KEEP_BYTES:
            path.replace(path.with_name(path.name + ".1"))
        out = open(path, "ab")  # noqa: SIM115 - handed to the JVM's process, closed after
        command = " ".join(sys.argv[1:]) or "lake"
        out.write(f"\n== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} pid {os.getpid()}: lake {command}\n".encode())
        out.flush()
        return out
    except OSError:
        return None


def _launch_jvm(conf: dict[str, str]) -> None:
    """Start Spark's JVM (the Py4J gateway, as PySpark would with ``conf``) with its output sent to
    the file :func:`send_jvm_output_to` named; nothing when none is named or a JVM runs."""
    from pyspark import SparkConf, SparkContext
    from pyspark.errors import PySparkRuntimeError
    from pyspark.java_gateway import launch_gateway

    if _jvm_output is None or submitted() or SparkContext._gateway is not None:
        return
    out = _open_jvm_log(_jvm_output)
    if out is None:
        return
    settings = SparkConf(loadDefaults=False)
    for key, value in conf.items():
        settings.set(key, value)
    try:
        with SparkContext._lock:
            gateway = launch_gateway(settings, popen_kwargs={"stdout": out, "stderr": out})
            SparkContext._gateway, SparkContext._jvm = gateway, gateway.jvm
    except PySparkRuntimeError:
        raise UserError(f"Spark's JVM did not start: {_last_line(_jvm_output)} (see {_jvm_output})") from None
    finally:
        out.close()  # the JVM has its own descriptor


@contextmanager
def _allocator_preloaded() -> Iterator[None]:
    """This process's environment, which PySpark hands to the JVM it launches, with jemalloc preloaded
    (:func:`spark_jobs.seams.jvm.allocator_env`) while the JVM starts; as it was afterwards, so no
    other child of this process inherits the preload."""
    before = os.environ.get("LD_PRELOAD")
    os.environ.update(allocator_env(os.environ))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = before


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    return lines[-1].strip() if lines else "it printed nothing"


def _log4j_config() -> str:
    return str(Path(__file__).with_name("log4j2.properties"))


def catalog_conf(root: Root | Path) -> dict[str, str]:
    """The settings of a persistent catalog under the lake root ``root``."""
    layout = Layout(root)
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(layout.warehouse),
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={layout.catalog / 'metastore_db'};create=true"
        ),
        # the metastore creates its own schema in a new Derby database, and keeps quiet about it
        "spark.hadoop.datanucleus.schema.autoCreateAll": "true",
        "spark.hadoop.hive.metastore.schema.verification": "false",
        # Derby's own log (derby.log) goes beside the metastore, not into the working directory
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={layout.catalog}",
    }


def spark_conf(master: str | None = None, app_name: str = "lake", root: Root | None = None) -> dict[str, str]:
    """The settings :func:`get_spark` uses (exposed for spark-submit and tests); ``root``: with the
    settings of its file system (an object store's endpoint)."""
    ui = os.environ.get("LAKE_SPARK_UI", "0") == "1"
    log4j = f"-Dlog4j.configurationFile=file:{_log4j_config()}"
    jvm = os.environ.get("LAKE_JVM_OPTS", "-XX:+UseParallelGC")
    master = master or os.environ.get("LAKE_SPARK_MASTER") or DEFAULT_MASTER
    partitions = os.environ.get("LAKE_SHUFFLE_PARTITIONS") or default_partitions(master)
    conf = {
        "spark.jars": ",".join(str(jar) for jar in [*locked_jars("spark"), *product_jars()]),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # Delta's log replay (after every commit, before the next read or write of the table) runs
        # as a Spark job with this many partitions (50 by default): on a local master one, as a
        # table's log is small next to its data (measured: a small table's read 1.1 -> 0.95 s, its
        # MERGE 2.5 -> 2.25 s against two)
        "spark.databricks.delta.snapshotPartitions": "1" if master.startswith("local") else partitions,
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.sql.shuffle.partitions": partitions,
        "spark.default.parallelism": partitions,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "true" if ui else "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": f"{log4j} {jvm} {class_archive_options(jvm)}".rstrip(),
        "spark.executor.extraJavaOptions": f"{log4j} {jvm}",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.streaming.stopGracefullyOnShutdown": "true",
        # Spark keeps the classes it compiles for a plan's code in a cache of 100 by default, per
        # class loader (the driver's and the executors'). A join's micro-batch runs about 145
        # distinct ones (its operator's stage, the counts, select, the changelog, Delta's MERGE
        # and log replay), so with 100 every batch compiled them all again: 133 compilations per
        # batch of a small fk join, none with room for them (docs/benchmarks.md, "The profile")
        "spark.sql.codegen.cache.maxEntries": str(CODEGEN_CACHE),
        # the joins keep their state in Spark's state store (transformWithState needs RocksDB); a
        # batch commits the changed keys' changelog, not a snapshot of the whole store
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # Memory sized to the work (docs/benchmarks.md, "Memory"): the state is in RocksDB, off the
        # heap, so the heap holds a micro-batch's rows, not the state. The fk join's first load of
        # 1,000,000 products (one batch of 1,100,000 records) peaked at 0.87 GB live after a GC: 2 GB
        # is 2.3x that. RocksDB's memtables and block cache are one budget for all the state
        # stores of the process (each store would otherwise take up to 2 x 64 MB of memtables).
        "spark.driver.memory": os.environ.get("LAKE_DRIVER_MEMORY", "2g"),
        "spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage": "true",
        "spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB": os.environ.get(
            "LAKE_STATE_MEMORY_MB", "500"
        ),
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
    }
    if os.environ.get("LAKE_SPARK_CORES_MAX"):  # on a shared cluster: cores per application
        conf["spark.cores.max"] = os.environ["LAKE_SPARK_CORES_MAX"]
    if root is not None:
        conf.update(hadoop_conf(root))
    return conf


def default_partitions(master: str) -> str:
    """Shuffle partitions for ``master``: a local master's cores (``local[2]``: 2; ``local[*]``: the
    machine's; ``local``: 1), else 4. More partitions than cores only add tasks to a small batch's joins."""
    found = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", master)
    if not found:
        return "4"
    cores = found.group(1)
    if cores is None:  # "local": one thread
        return "1"
    return str(os.cpu_count() or 1) if cores == "*" else cores


def submit_conf(root: Root | None = None) -> dict[str, str]:
    """``--conf`` settings for spark-submit: the session's settings except the deploy ones, which
    spark-submit takes from its connection (master) and arguments. The driver's JVM options go too:
    in client mode spark-submit starts the driver JVM with them."""
    conf = spark_conf(root=root)
    return {k: v for k, v in conf.items() if k not in DEPLOY_KEYS[:2]}


def submitted() -> bool:
    """True inside an application started by spark-submit (its JVM gateway is given to Python)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def arrow_frame(spark: Any, table: Any) -> Any:
    """A Spark DataFrame of a pyarrow Table. PySpark 4.2's ``createDataFrame(pyarrow.Table)`` stops
    at an empty record batch and silently drops every row after it (a concatenation of tables often
    has one), so the table is combined into one batch first."""
    return spark.createDataFrame(table.combine_chunks())


def get_spark(
    master: str | None = None,
    app_name: str = "lake",
    catalog: Root | Path | None = None,
    root: Root | None = None,
):
    """Return the process's SparkSession, building it on first use; ``root``: a lake root it reads and
    writes (an object store's settings, :func:`use_root`).

    The master and the catalog are fixed when the session is built; asking again with another
    master, or for a catalog the session was built without, is an error rather than a silent no-op.
    """
    root = root if root is not None else (catalog if isinstance(catalog, Root) else None)
    # Workers must run this interpreter, or the project's packages are missing inside them.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    conf = spark_conf(master, app_name, root)
    if catalog is not None:
        extra = catalog_conf(catalog)
        extra["spark.driver.extraJavaOptions"] = (
            f"{conf['spark.driver.extraJavaOptions']} {extra['spark.driver.extraJavaOptions']}"
        )
        conf.update(extra)
        Layout(catalog).catalog.mkdir(parents=True, exist_ok=True)
    active = SparkSession.getActiveSession()
    if active is not None:
        current = active.sparkContext.master
        if master and current != master:
            raise RuntimeError(f"a Spark session with master {current} already exists")
        if (
            catalog is not None
            and active.conf.get("spark.sql.warehouse.dir") != conf["spark.sql.warehouse.dir"]
        ):
            raise RuntimeError("the running Spark session was built without this lake's catalog")
        if root is not None:
            use_root(active, root)
        return active
    if submitted():
        conf = {k: v for k, v in conf.items() if k not in DEPLOY_KEYS}
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    with _allocator_preloaded():
        _launch_jvm(conf)
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    fences.apply(spark)  # the leases this process took before its session started
    return spark


def use_root(spark: Any, root: Root) -> None:
    """Give a running session the settings of ``root``'s file system (a session built before the root
    was known: a test's, the pipeline test driver's). Spark hands its Hadoop settings to the tasks of
    every job it starts after this; a Spark Connect session's server got them when it started."""
    settings = hadoop_conf(root)
    jsc = getattr(getattr(spark, "sparkContext", None), "_jsc", None) if settings else None
    if jsc is None:
        return
    hadoop, conf = jsc.hadoopConfiguration(), jsc.sc().conf()  # (Delta reads its log store from the latter)
    for key, value in settings.items():
        if key.startswith("spark.hadoop."):
            hadoop.set(key.removeprefix("spark.hadoop."), value)
        else:
            conf.set(key, value)
