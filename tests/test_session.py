import pytest

from spark_jobs.session import default_partitions, spark_conf


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
