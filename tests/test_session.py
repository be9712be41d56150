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
