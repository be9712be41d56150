"""The pipeline file: every section validated with one line naming the file, line and key."""

from __future__ import annotations

import pytest
from joinkit import write_config

from spark_jobs.cli import main
from spark_jobs.config import bundled_config_path, load_config
from spark_jobs.errors import UserError


@pytest.fixture
def cfg(tmp_path):
    return write_config(tmp_path)


@pytest.mark.parametrize(
    "config_text,message",
    [
        ("topics:\n  t1:\n    partitions: four\n", "p.yaml:3: topics.t1.partitions: must be a positive integer"),
        ("topics:\n  t1: [\n", "p.yaml:3: not valid YAML"),
        ("topcs:\n  t1: {}\n", "p.yaml:1: topcs: unknown top-level key"),
        ("topics:\n  t1:\n    partitions: 2\n    key: utf16\n", "p.yaml:4: topics.t1.key: must be one of string, bytes"),
        ("topics:\n  t1:\n    value: json\n", "p.yaml:2: topics.t1.partitions: is required"),
        ("topics: {}\n", "p.yaml:1: topics: must be a non-empty mapping"),
        # a topic's bronze table would be one of the lake's own tables
        ("topics:\n  x: {partitions: 1}\n  quarantine: {partitions: 1}\n", "p.yaml:3: topics.quarantine: 'quarantine' would share"),
        ("topics:\n  quality_runs: {partitions: 1}\n", "p.yaml:2: topics.quality_runs: 'quality_runs' would share"),
        ("topics:\n  join_metrics: {partitions: 1}\n", "p.yaml:2: topics.join_metrics: 'join_metrics' would share"),
        ("topics:\n  lookup_accounts: {partitions: 1}\n", "p.yaml:2: topics.lookup_accounts: 'lookup_accounts' would share"),
        ("topics:\n  j__left: {partitions: 1}\n", "p.yaml:2: topics.j__left: 'j__left' would share its bronze table's name with the lake's own tables (quarantine, quality_runs, join_metrics, lookup_<name>, <join>__<state>); choose another"),
    ],
)  # fmt: skip
def test_malformed_config_is_one_line_naming_file_line_and_key(tmp_path, capsys, config_text, message):
    cfg = tmp_path / "p.yaml"
    cfg.write_text(config_text)
    assert main(["--root", str(tmp_path / "lake"), "--config", str(cfg), "topics"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lake: error: ") and message in err
    assert not (tmp_path / "lake").exists()


@pytest.mark.parametrize(
    ("join", "message"),
    [
        ("{kind: nope, left: L, right: R, select: {a: left.v}}", "kind: must be one of table, stream-table"),
        (
            "{kind: stream-table, left: L, right: R, type: outer, select: {a: left.v}}",
            "type: must be one of inner, left",
        ),
        ("{kind: stream-stream, left: L, right: R, select: {a: left.v}}", "window: is required"),
        (
            "{kind: table, left: L, right: R, window: 1 minute, select: {a: left.v}}",
            "applies to stream-stream",
        ),
        ("{kind: stream-stream, left: L, right: R, window: soon, select: {a: left.v}}", "positive duration"),
        ("{kind: table, left: L, right: nope, select: {a: left.v}}", "right: must name a declared topic"),
        ("{kind: table, left: L, right: L, select: {a: left.v}}", "must be a different topic"),
        (
            "{kind: table, left: L, right: R, select: {key: left.v}}",
            "'key' is a column every table result has",
        ),
        ("{kind: table, left: L, right: R, select: {}}", "select: must be a mapping"),
        ("{kind: table, left: L, right: R, select: {a: left.v}, publish: L}", "is declared already"),
        (
            "{kind: table, left: L, right: R, select: {a: left.v}, consumer_group: 'a b'}",
            "consumer_group: must be a consumer group name (letters, digits, '.', '_', '-') or false",
        ),
    ],
)
def test_join_config_errors_name_the_line(tmp_path, join, message):
    path = tmp_path / "p.yaml"
    path.write_text(f"topics:\n  L: {{partitions: 2}}\n  R: {{partitions: 2}}\njoins:\n  j: {join}\n")
    with pytest.raises(UserError) as err:
        load_config(path)
    assert "p.yaml:5: joins.j." in str(err.value) and message in str(err.value)


def test_a_joins_consumer_group_is_named_after_the_pipeline_unless_set(tmp_path):
    path = tmp_path / "p.yaml"
    joins = {"d": "", "own": ", consumer_group: ops.orders", "off": ", consumer_group: false"}
    path.write_text(
        "pipeline: shop\ntopics:\n  L: {partitions: 2}\n  R: {partitions: 2}\njoins:\n"
        + "".join(
            f"  {n}: {{kind: table, left: L, right: R, select: {{a: left.v}}{extra}}}\n"
            for n, extra in joins.items()
        )
    )
    config = load_config(path)
    assert [config.consumer_group(config.join(n)) for n in joins] == ["lake.shop.d", "ops.orders", None]


def test_join_config_reads_window_and_publish(cfg):
    assert cfg.join("ss_left").window_ms == 10_000
    assert cfg.join("t_left").publish == "t_left_changelog"
    assert cfg.topic("t_left_changelog").partitions == cfg.topic("L").partitions == 2


@pytest.mark.parametrize(
    ("join", "message"),
    [
        ("{kind: fk, left: P, right: M, select: {a: left.v}}", "foreign_key: is required for a fk join"),
        (
            "{kind: fk, left: P, right: M, foreign_key: m, type: outer, select: {a: left.v}}",
            "type: must be one of inner, left",
        ),
        ("{kind: list, left: PE, right: A, list: ids, select: {a: left.v}}", "elements: must be a mapping"),
        (
            "{kind: list, left: PE, right: A, list: ids, elements: {id: right.v}}",
            "'id' is a column every element has",
        ),
        (
            "{kind: list, left: PE, right: A, list: ids, element_id: 'x y', elements: {a: right.v}}",
            "element_id: must be a field path",
        ),
        (
            "{kind: derive, left: M, right: A, key: v, select: {a: left.v}}",
            "right: applies to table, stream-table, stream-stream, fk, list joins only, not derive",
        ),
        ("{kind: derive, left: M, select: {a: left.v}}", "key: is required for a derive join"),
        (
            "{kind: derive, left: M, key: v, select: {master_key: left.v}}",
            "'master_key' is a column every derive result has",
        ),
        (
            "{kind: fk, left: P, right: M, foreign_key: m, list: ids, select: {a: left.v}}",
            "list: applies to list joins only, not fk",
        ),
    ],
)
def test_keyed_join_config_errors_name_the_line(tmp_path, join, message):
    text = (
        "topics:\n  P: {partitions: 1}\n  M: {partitions: 1}\n  PE: {partitions: 1}\n  A: {partitions: 1}\n"
    )
    (tmp_path / "p.yaml").write_text(text + f"joins:\n  j: {join}\n")
    from spark_jobs.config import load_config

    with pytest.raises(UserError, match=message) as err:
        load_config(tmp_path / "p.yaml")
    assert f"{tmp_path / 'p.yaml'}:7: joins.j" in str(err.value)


def test_config_rejects_partition_counts_no_broker_accepts(tmp_path):
    for count, message in [(0, "must be a positive integer, got 0"), (10**9, "must be at most 10,000")]:
        path = tmp_path / "p.yaml"
        path.write_text(f"topics:\n  t: {{partitions: {count}}}\n")
        with pytest.raises(UserError, match=rf"p.yaml:2: topics.t.partitions: {message}"):
            load_config(path)


def test_the_airflow_section_of_a_pipeline_is_validated(tmp_path):
    from spark_jobs.errors import UserError

    text = bundled_config_path().read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        text.replace("../", str(bundled_config_path().parent) + "/../") + "airflow:\n  retries: -1\n"
    )
    with pytest.raises(
        UserError, match=r"bad.yaml:\d+: airflow.retries: must be a non-negative integer, got -1"
    ):
        load_config(bad)
    bad.write_text(
        text.replace("../", str(bundled_config_path().parent) + "/../") + "airflow:\n  shedule: x\n"
    )
    with pytest.raises(UserError, match=r"airflow.shedule: unknown setting"):
        load_config(bad)


def test_the_kafka_section_reads_the_cluster_and_expands_settings_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_PASSWORD", "s3cret")
    path = tmp_path / "p.yaml"
    path.write_text(
        "kafka:\n  bootstrap_servers: a:9092,b:9093\n  topic_prefix: team.\n"
        "  security.protocol: SASL_SSL\n  sasl.password: ${KAFKA_PASSWORD}\n  enable.ssl.certificate.verification: false\n"
        "topics:\n  t: {partitions: 1}\n"
    )
    kafka = load_config(path).kafka
    assert (kafka.bootstrap_servers, kafka.topic_prefix) == ("a:9092,b:9093", "team.")
    assert kafka.settings == {
        "security.protocol": "SASL_SSL",
        "sasl.password": "s3cret",
        "enable.ssl.certificate.verification": "false",
    }


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            "  bootstrap_servers: nohost\n",
            "p.yaml:2: kafka.bootstrap_servers: must be HOST:PORT[,HOST:PORT...]",
        ),
        ("  topic_prefix: 'a b'\n", "p.yaml:2: kafka.topic_prefix: must be letters, digits"),
        (
            "  sasl.password: ${NOT_SET_ANYWHERE}\n",
            "p.yaml:2: kafka.sasl.password: refers to ${NOT_SET_ANYWHERE}",
        ),
        ("  transactional.id: x\n", "p.yaml:2: kafka.transactional.id: is set by the product"),
        ("  linger.ms: [1]\n", "p.yaml:2: kafka.linger.ms: must be a string or number"),
    ],
)
def test_kafka_section_errors_name_the_line(tmp_path, monkeypatch, section, message):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    path = tmp_path / "p.yaml"
    path.write_text("kafka:\n" + section + "topics:\n  t: {partitions: 1}\n")
    with pytest.raises(UserError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{tmp_path}/{message}")
