from pathlib import Path

import pytest

from spark_jobs.seams.session import default_partitions, spark_conf


@pytest.mark.parametrize(
    ("master", "partitions"),
    [("local[2]", "2"), ("local", "1"), ("local[3,2]", "3"), ("spark://spark-master:7077", "4")],
)
def test_shuffle_partitions_follow_a_local_masters_cores(master, partitions):
    assert default_partitions(master) == partitions


def test_shuffle_partitions_setting_wins(monkeypatch):
    monkeypatch.setenv("LAKE_SHUFFLE_PARTITIONS", "7")
    conf = spark_conf("local[2]")
    assert (conf["spark.sql.shuffle.partitions"], conf["spark.default.parallelism"]) == ("7", "7")
    monkeypatch.delenv("LAKE_SHUFFLE_PARTITIONS")
    assert spark_conf("local[2]")["spark.sql.shuffle.partitions"] == "2"


def test_deltas_log_replay_is_one_task_on_a_local_master_and_the_shuffle_width_on_a_cluster(monkeypatch):
    monkeypatch.delenv("LAKE_SHUFFLE_PARTITIONS")
    key = "spark.databricks.delta.snapshotPartitions"
    assert spark_conf("local[2]")[key] == "1"
    assert spark_conf("spark://spark-master:7077")[key] == "4"


def test_the_driver_maps_the_class_archive_setup_wrote_and_executors_do_not(spark):
    from spark_jobs.seams.jvm import CLASS_ARCHIVE

    assert CLASS_ARCHIVE.is_file(), "make setup writes it"
    conf = spark_conf("local[2]")
    assert f"-XX:SharedArchiveFile={CLASS_ARCHIVE}" in conf["spark.driver.extraJavaOptions"]
    assert "SharedArchiveFile" not in conf["spark.executor.extraJavaOptions"]  # other machines, other jars
    # the run's own driver JVM was started with it, with class sharing on
    jvm = spark.sparkContext._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={CLASS_ARCHIVE}" in arguments
    assert "sharing" in jvm.java.lang.System.getProperty("java.vm.info")


def test_no_archive_is_mapped_while_one_is_written(monkeypatch):
    monkeypatch.setenv("LAKE_JVM_OPTS", "-XX:ArchiveClassesAtExit=/tmp/next.jsa")
    assert "SharedArchiveFile" not in spark_conf("local[2]")["spark.driver.extraJavaOptions"]


def test_the_driver_jvm_runs_on_jemalloc_and_nothing_else_this_process_starts_inherits_it(spark):
    import os

    from spark_jobs.seams.jvm import ALLOCATOR

    assert ALLOCATOR.is_file(), "make setup fetches it (infra/setup.sh, libjemalloc2)"
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    assert str(ALLOCATOR) in Path(f"/proc/{pid}/maps").read_text()
    assert str(ALLOCATOR) not in os.environ.get("LD_PRELOAD", "")  # the preload was for the JVM alone


def test_the_allocator_goes_first_in_a_callers_preload_and_glibc_can_be_asked_for(monkeypatch):
    from spark_jobs.seams import jvm

    monkeypatch.setattr(jvm, "ALLOCATOR", Path(__file__))  # any file: setup's jemalloc stands here
    assert jvm.allocator_env({"HOME": "/h"}) == {"HOME": "/h", "LD_PRELOAD": __file__}
    assert jvm.allocator_env({"LD_PRELOAD": "/x.so"})["LD_PRELOAD"] == f"{__file__} /x.so"
    assert jvm.allocator_env({"LD_PRELOAD": __file__}) == {"LD_PRELOAD": __file__}  # not twice
    assert jvm.allocator_env({"LAKE_MALLOC": "glibc"}) == {"LAKE_MALLOC": "glibc"}
    monkeypatch.setattr(jvm, "ALLOCATOR", Path("/nonexistent/libjemalloc.so.2"))
    assert jvm.allocator_env({}) == {}  # setup did not fetch one: the C library's allocator
