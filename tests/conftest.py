"""Shared fixtures: one Spark session, one embedded Kafka broker and one embedded Schema Registry for
the whole run, a fresh lake root and a fresh topic namespace per test."""

from __future__ import annotations

import itertools
import os
import socket
import sys

import pytest

os.environ.setdefault("LAKE_SHUFFLE_PARTITIONS", "2")
# The processes the tests start are short and their data small: the C1 compiler alone (no C2) cut a
# `lake check` on a tiny lake from 131 to 78 CPU-seconds, a Spark start and first job from 34 to 20.
# Every process a test starts (CLI, spark-submit, Airflow, the detached joins) inherits it; the run's
# own session (the `spark` fixture) does not.
os.environ.setdefault("LAKE_JVM_OPTS", "-XX:+UseParallelGC -XX:TieredStopAtLevel=1")
# A pytest-xdist worker runs under execnet, whose __main__ has neither a file nor a spec: PySpark's
# Connect package (imported by Great Expectations) takes that for a doctest run and exits the worker
# when an optional Connect dependency is missing. Name the worker's entry point for what it is.
_main = sys.modules["__main__"]
if getattr(_main, "__spec__", None) is None and not hasattr(_main, "__file__"):
    _main.__file__ = "pytest-xdist-worker"
SASL_USER, SASL_PASSWORD = "lake-test", "s3cret-lake"
_test_numbers = itertools.count(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session", autouse=True)
def kafka(tmp_path_factory):
    """One KRaft broker for the run (with a SASL/PLAIN listener for the pass-through test); every test
    and every process it starts reaches it through $LAKE_KAFKA_BOOTSTRAP."""
    from spark_jobs.seams import broker

    root = tmp_path_factory.mktemp("kafka-broker")
    state = broker.Broker(root).start(
        _free_port(), sasl_port=_free_port(), sasl_users={SASL_USER: SASL_PASSWORD}
    )
    os.environ["LAKE_KAFKA_BOOTSTRAP"] = str(state.address)
    yield state
    broker.Broker(root).stop()


@pytest.fixture(scope="session", autouse=True)
def schema_registry(tmp_path_factory):
    """One embedded Schema Registry for the run; every test and every process it starts reaches it
    through $LAKE_SCHEMA_REGISTRY_URL (each test's subjects are its topics', under its own prefix)."""
    from spark_jobs.seams import embedded_registry

    root = tmp_path_factory.mktemp("schema-registry")
    state = embedded_registry.Registry(root).start(_free_port())
    os.environ["LAKE_SCHEMA_REGISTRY_URL"] = str(state.address)
    yield state
    embedded_registry.Registry(root).stop()


S3_BUCKET = "lake-tests"


@pytest.fixture(scope="session", autouse=True)
def s3_store(tmp_path_factory):
    """One embedded S3-compatible store for the run, reached the way a user's own store is: through
    AWS_ENDPOINT_URL and the AWS_* credentials (set before any Spark starts: its S3A connector reads
    them). Tests keep their lakes under s3a://lake-tests/<a prefix of their own>."""
    from spark_jobs.seams import embedded_s3

    work = tmp_path_factory.mktemp("s3-store")
    state = embedded_s3.S3Store(work).start(_free_port(), buckets=(S3_BUCKET,))
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": str(state.address),
            "AWS_ACCESS_KEY_ID": str(state.details["access_key"]),
            "AWS_SECRET_ACCESS_KEY": str(state.details["secret_key"]),
            "AWS_REGION": embedded_s3.REGION,
        }
    )
    yield state
    embedded_s3.S3Store(work).stop()


@pytest.fixture
def s3(s3_store):
    """The run's S3 store as any S3 client sees it (pyarrow's), with the settings the lake uses."""
    from pyarrow import fs

    return fs.S3FileSystem(
        access_key=s3_store.details["access_key"],
        secret_key=s3_store.details["secret_key"],
        endpoint_override=s3_store.address,
        region=os.environ["AWS_REGION"],
    )


def bucket_files(s3, prefix: str) -> list[str]:
    """The objects under ``prefix`` of the tests' bucket, as ``bucket/key``."""
    from pyarrow import fs

    selector = fs.FileSelector(f"{S3_BUCKET}/{prefix}", recursive=True)
    return [info.path for info in s3.get_file_info(selector) if info.type == fs.FileType.File]


@pytest.fixture(autouse=True)
def _own_topics(monkeypatch, request):
    """Each test's Kafka topics live under a prefix of its own (tests share the broker)."""
    monkeypatch.setenv("LAKE_KAFKA_TOPIC_PREFIX", f"t{next(_test_numbers)}.")


@pytest.fixture
def cluster(demo_config, lake):
    """The Kafka cluster as the demo pipeline reaches it in this test."""
    from spark_jobs.seams.kafka import connect

    return connect(demo_config, lake.root)


@pytest.fixture(scope="session")
def spark():
    """The run's own Spark session. Its JVM lives as long as the run, so it keeps the default JIT (C2
    pays back over half an hour of tests); only the short processes the tests start get C1."""
    from spark_jobs.seams.session import get_spark

    short = os.environ.pop("LAKE_JVM_OPTS", None)
    try:
        session = get_spark(app_name="lake-tests")
    finally:
        if short is not None:
            os.environ["LAKE_JVM_OPTS"] = short
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _no_query_outlives_its_test(request):
    """The joins' test queries (spark_jobs.testing.JoinQuery) stop with the test that started them."""
    yield
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    for query in session.streams.active if session is not None else []:
        if query.name and query.name.startswith("test_"):
            query.stop()


@pytest.fixture
def lake(tmp_path):
    from spark_jobs.seams.delta import Lake

    return Lake(tmp_path / "lake")


@pytest.fixture
def demo_config():
    from spark_jobs.config import load_config

    return load_config(None)


@pytest.fixture(autouse=True)
def _no_ambient_lake_env(monkeypatch):
    """Tests never pick up a developer's LAKE_ROOT / LAKE_CONFIG."""
    monkeypatch.delenv("LAKE_ROOT", raising=False)
    monkeypatch.delenv("LAKE_CONFIG", raising=False)


# The longest files first, the longest two on different workers (`make test` runs pytest-xdist with
# --dist loadfile --no-loadscope-reorder, which hands out files in this order, two to each worker at
# the start): otherwise one worker ends the run alone on an Airflow file for ten minutes.
LONGEST_FIRST = (
    "test_cli.py",
    "test_join_runner.py",
    "test_cluster.py",
    "test_join_properties.py",
    "test_stories.py",
    "test_airflow.py",
    "test_backfill_crashes.py",
    "test_registry_stories.py",
    "test_registry_faults.py",
    "test_object_storage.py",  # two-machine stories on the embedded S3 store: about 6 minutes
    "test_embedded_registry.py",  # mostly waiting (schemas registered 40 s apart): beside the others
    "test_fk.py",
    "test_formats.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: n for n, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file keeps its order


_exit_status: list[int] = []


def pytest_sessionfinish(session, exitstatus):
    _exit_status.append(int(exitstatus))


def pytest_unconfigure(config):
    """Leave with pytest's own exit status once it has reported everything.

    Arrow's native thread pools can abort the process during interpreter teardown, after all work
    is done ("terminate called without an active exception": apache/arrow#34314); the `lake` CLI exits the same way for the same reason. The result of the
    run is already decided and printed at this point; nothing is hidden."""
    if _exit_status and os.environ.get("LAKE_TEST_NORMAL_EXIT") != "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])
