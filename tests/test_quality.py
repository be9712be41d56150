"""Quality suites: each expectation fails on purpose-built data with the exact offending keys, and
passes on clean data; reports (Data Docs, summary, quality_runs) say so."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from topickit import produce_lines

from spark_jobs.cli import main
from spark_jobs.config import load_config
from spark_jobs.formats import Formats
from spark_jobs.quality.run import run_suites
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.kafka import connect
from spark_jobs.system_tables import QUALITY_RUNS
from spark_jobs.topics.snapshots import SnapshotReader, take

CONFIG = """
topics:
  orders: {partitions: 4}
  customers: {partitions: 4}
  narrow: {partitions: 3}
lookups:
  customers: {topic: customers, joined_with: [orders]}
quality:
  suites:
    broken: suite.yaml
"""
SUITE = """
suite: broken
version: 3
checks:
  - completeness: {stream: orders, lookup: customers}
  - co_partitioning: {topics: [orders, customers]}
  - co_partitioning: {topics: [orders, narrow]}
  - key_format: {topics: [orders]}
  - lookup_basics: {lookup: customers}
"""


def put(lake, config, topic, lines: bytes, partitioner="murmur2", value_format=None):
    """The topic's records on Kafka, one transaction (the suites read Kafka); unlike `lake produce`,
    nothing is checked, so bad values can be planted."""
    produce_lines(lake, config, topic, lines, partitioner=partitioner)


@pytest.fixture(scope="module")
def broken(spark, tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:  # the module's topics, apart from every test's
        env.setenv("LAKE_KAFKA_TOPIC_PREFIX", f"quality-{uuid.uuid4().hex[:8]}.")
        return _broken(spark, tmp_path_factory)


def _broken(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("quality")
    (root / "p.yaml").write_text(CONFIG)
    (root / "suite.yaml").write_text(SUITE)
    config = load_config(root / "p.yaml")
    lake = Lake(root / "lake")
    put(
        lake,
        config,
        "orders",
        b'user_1|{"n":1}\nuser_1|{"n":2}\nuser_3|{"n":3}\nuser_10|{"n":4}\nuser_4|{"n":5}\n',
    )
    put(
        lake,
        config,
        "orders",
        b'"user_5"|{}\nuser_6 |{}\n\x00\x00\x00\x00\x07user_7|{}\n',
        value_format="string",
    )
    put(lake, config, "narrow", b"user_1|{}\n")
    put(lake, config, "customers", b'user_1|{"ok":1}\nuser_4|not json\n', value_format="string")
    put(lake, config, "customers", b'user_10|{"ok":1}\n', partitioner="consistent_random")
    report = run_suites(spark, lake, config, report_dir=root / "reports", log=lambda m: None)
    return lake, config, report, root


def result(report, check, expectation_start=""):
    found = [r for r in report.results if r.check == check and r.expectation.startswith(expectation_start)]
    assert len(found) == 1, [(r.check, r.expectation) for r in report.results]
    return found[0]


# Placement (murmur2, 4 partitions; pinned by test_partitioners): user_1 -> 3, user_3 -> 2, user_4 -> 2,
# user_10 -> 1, "user_5" -> 1, "user_6 " -> 3, <SR framing>user_7 -> 2; user_1 over 3 partitions -> 0.
# Offsets follow produce order per partition, and each put's transaction ends with a commit marker in
# every partition it wrote: p3 user_1@0,1 (marker 2) "user_6 "@3; p2 user_3@0 user_4@1 (marker 2)
# user_7@3; p1 user_10@0 (marker 1) "user_5"@2. customers: user_10 written with crc32 -> partition 0.
SR_USER_7 = "\\x00\\x00\\x00\\x00\\x07user_7 (hex 0000000007757365725F37)"


def test_completeness_lists_exactly_the_missing_keys_with_references(broken):
    r = result(broken[2], "completeness:orders->customers")
    assert (r.success, r.offending_total) == (False, 4)
    ref = "referenced by 1 record(s) of orders, first at partition {p} offset {o}, last at partition {p} offset {o}"
    assert r.offending == [
        f"{SR_USER_7} ({ref.format(p=2, o=3)})",
        f'"user_5" ({ref.format(p=1, o=2)})',
        f"user_3 ({ref.format(p=2, o=0)})",
        f"user_6  ({ref.format(p=3, o=3)})",
    ]
    assert "FAILED: 4 keys missing in customers: " in r.description and "user_3 (referenced" in r.description


def test_co_partitioning_pinpoints_the_misplaced_key_and_the_topic(broken):
    counts = result(broken[2], "co_partitioning:orders+customers", "Topics")
    assert (counts.success, counts.offending) == (True, [])
    keys = result(broken[2], "co_partitioning:orders+customers", "Every key")
    assert not keys.success
    assert keys.offending == [
        "user_10: in customers at partition 0 but murmur2 places it in 1; different partitions: orders=1, customers=0"
    ]


def test_partition_count_mismatch(broken):
    counts = result(broken[2], "co_partitioning:orders+narrow", "Topics")
    assert (counts.success, counts.offending) == (False, ["narrow has 3 partitions but orders has 4"])
    keys = result(broken[2], "co_partitioning:orders+narrow", "Every key")
    assert keys.offending == ["user_1: different partitions: orders=3, narrow=0"]


def test_key_format_shows_each_bad_key_escaped_and_in_hex(broken):
    r = result(broken[2], "key_format:orders")
    assert not r.success
    assert r.offending == [
        f"orders: {SR_USER_7} starts with Schema Registry framing (0x00 + 4-byte schema id); contains control characters",
        'orders: "user_5" is wrapped in double quotes (JSON-encoded string)',
        "orders: user_6  has leading or trailing whitespace",
    ]


def test_lookup_basics_flags_values_that_do_not_parse(broken):
    r = result(broken[2], "lookup_basics:customers")
    assert not r.success and r.offending == ["user_4: value does not parse as JSON"]


def test_reports_say_it_in_plain_words_and_history_is_recorded(broken):
    lake, _, report, root = broken
    assert not report.success
    docs = root / "reports" / "gx" / "uncommitted" / "data_docs" / "local_site"
    assert report.data_docs == f"file://{docs}/index.html"
    pages = "".join(p.read_text() for p in (docs / "validations").rglob("*.html"))
    for words in (
        "FAILED: 4 keys missing in customers",
        "user_10: in customers at partition 0 but murmur2 places it in 1",
        "narrow has 3 partitions but orders has 4",
        "value does not parse as JSON",
    ):
        assert words in pages
    summary = (root / "reports" / "summary.html").read_text()
    assert "Some checks FAILED" in summary and "user_6  (referenced by 1 record(s)" in summary
    # Data Docs links are relative to each page, so they work on disk and served over http
    assert "<a href='gx/uncommitted/data_docs/local_site/index.html'>" in summary
    run_page = Path(report.summary_html).read_text()
    assert "<a href='../gx/uncommitted/data_docs/local_site/index.html'>" in run_page
    assert json.loads((root / "reports" / "summary.json").read_text())["success"] is False
    runs = lake.read_arrow(QUALITY_RUNS).to_pylist()
    assert len(runs) == len(report.results) == 7
    assert {(r["check"], r["success"], r["offending_total"]) for r in runs} == {
        (x.check, x.success, x.offending_total) for x in report.results
    }
    assert {r["suite_version"] for r in runs} == {3} and len({r["run_id"] for r in runs}) == 1


def test_clean_lake_passes_and_cli_exit_codes(spark, broken, tmp_path, capsys):
    _, config, _, root = broken
    lake = Lake(tmp_path / "lake")
    put(lake, config, "orders", b'user_1|{"n":1}\n')
    put(lake, config, "customers", b'user_1|{"ok":1}\n')
    put(lake, config, "narrow", b"user_2|{}\n")
    cfg = ["--root", str(tmp_path / "lake"), "--config", str(root / "p.yaml")]
    assert main([*cfg, "check", "--report-dir", str(tmp_path / "r")]) == 1  # narrow still has 3 partitions
    out = capsys.readouterr().out
    assert "PASS  broken / completeness:orders->customers" in out
    assert (
        "FAIL  broken / co_partitioning:orders+narrow: Topics orders, narrow have the same partition count."
        in out
    )
    (root / "ok.yaml").write_text(
        SUITE.replace("  - co_partitioning: {topics: [orders, narrow]}\n", "").replace("broken", "ok")
    )
    (root / "p2.yaml").write_text(CONFIG.replace("broken: suite.yaml", "ok: ok.yaml"))
    cfg2 = ["--root", str(tmp_path / "lake"), "--config", str(root / "p2.yaml")]
    assert main([*cfg2, "check", "--report-dir", str(tmp_path / "r2")]) == 0
    (root / "bad.yaml").write_text(
        "suite: bad\nchecks:\n  - completeness: {stream: nope, lookup: customers}\n"
    )
    (root / "p3.yaml").write_text(CONFIG.replace("broken: suite.yaml", "bad: bad.yaml"))
    capsys.readouterr()
    assert main(["--root", str(tmp_path / "lake"), "--config", str(root / "p3.yaml"), "check"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("lake: error: ")
        and "bad.yaml:3: checks.0.completeness.stream: must name a topic" in err
    )


def test_key_format_requires_joined_topics_to_agree_on_encoding(spark, tmp_path):
    from spark_jobs.quality.key_format import key_format_findings

    (tmp_path / "p.yaml").write_text("topics:\n  a: {partitions: 2}\n  b: {partitions: 2, key: bytes}\n")
    config = load_config(tmp_path / "p.yaml")
    lake = Lake(tmp_path / "lake")
    put(lake, config, "a", b"k1|{}\n")
    put(lake, config, "b", b"\xff\x01|{}\n")  # fine for bytes keys
    cluster = connect(config, lake.root)
    snapshot = take(cluster, config.topics.values())
    topics = SnapshotReader(
        spark, cluster, config.topics, snapshot, Formats(config, lake.root, cluster.topic)
    )
    rows = key_format_findings(spark, topics, config, ["a", "b"]).filter("problem IS NOT NULL").collect()
    assert [tuple(r) for r in rows] == [("b", None, None, "declares bytes keys but a declares string")]
