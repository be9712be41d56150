"""The data-quality report as a person sees it: rendered by headless Chromium (Debian's ``chromium``,
driven by Playwright), checked for what is visible on the page."""

from __future__ import annotations

import io
import shutil
import uuid
from datetime import UTC, datetime

import pytest

from spark_jobs.config import load_config
from spark_jobs.lookups.backfill import run_backfill
from spark_jobs.quality.pages import failures_per_run, latest_per_suite, write_report
from spark_jobs.quality.run import run_suites
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.kafka import connect, watermarks
from spark_jobs.system_tables import QUALITY_RUNS
from spark_jobs.topics.produce_consume import produce_lines

CONFIG = """
pipeline: shop
topics:
  orders: {partitions: 4}
  customers: {partitions: 4}
lookups:
  customers:
    topic: customers
    joined_with: [orders]
    backfill: {source: dump.txt, format: lines, separator: "|"}
quality:
  suites:
    shop_lookups: suite.yaml
"""
SUITE = """
suite: shop_lookups
checks:
  - completeness: {stream: orders, lookup: customers}
  - co_partitioning: {topics: [orders, customers]}
  - lookup_basics: {lookup: customers}
"""
# user_3 / user_4 / user_10: murmur2 places them in 2 / 2 / 1, crc32 (kcat) in 0 / 3 / 0 (pinned by
# test_partitioners). Line 3 has no separator: quarantined.
DUMP = b'user_3|{"n":3}\nuser_4|{"n":4}\nbroken line\nuser_10|{"n":10}\n'


def test_latest_run_per_suite_and_failures_per_run():
    t = [datetime(2026, 11, 20, h, tzinfo=UTC) for h in (8, 9, 10)]
    runs = [
        {"run_id": "a", "run_time": t[0], "suite": "s1", "success": False},
        {"run_id": "a", "run_time": t[0], "suite": "s1", "success": False},
        {"run_id": "b", "run_time": t[1], "suite": "s1", "success": True},
        {"run_id": "b", "run_time": t[1], "suite": "s1", "success": False},
        {"run_id": "c", "run_time": t[2], "suite": "s2", "success": True},
    ]
    latest = latest_per_suite(runs)
    assert {s: [r["run_id"] for r in rows] for s, rows in latest.items()} == {"s1": ["b", "b"], "s2": ["c"]}
    assert failures_per_run(runs) == [(t[0], "a", 2, 2), (t[1], "b", 1, 2), (t[2], "c", 0, 1)]


@pytest.fixture(scope="module")
def shop(spark, tmp_path_factory):
    """Two failing runs: keys missing in the lookup, then a kcat-style backfill (one bad line
    quarantined) that fills them into the wrong partitions."""
    with pytest.MonkeyPatch.context() as env:  # the module's topics, apart from every test's
        env.setenv("LAKE_KAFKA_TOPIC_PREFIX", f"report-{uuid.uuid4().hex[:8]}.")
        return _shop(spark, tmp_path_factory)


def _shop(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    (root / "p.yaml").write_text(CONFIG)
    (root / "suite.yaml").write_text(SUITE)
    (root / "dump.txt").write_bytes(DUMP)
    config = load_config(root / "p.yaml")
    lake = Lake(root / "lake")
    orders = b"user_1|{}\nuser_3|{}\nuser_4|{}\nuser_10|{}\nuser_10|{}\n"
    cluster = connect(config, lake.root)
    produce_lines(cluster, config.topic("orders"), io.BytesIO(orders), "test", key_sep="|")
    produce_lines(cluster, config.topic("customers"), io.BytesIO(b'user_1|{"n":1}\n'), "test", key_sep="|")
    quiet = lambda m: None  # noqa: E731
    first = run_suites(spark, lake, config, log=quiet)
    run_backfill(spark, lake, config, "customers", partitioner="consistent_random", max_rejects=1, log=quiet)
    second = run_suites(spark, lake, config, log=quiet)
    assert not first.success and not second.success
    ends = {t: [high for _, high in watermarks(cluster, config.topic(t))] for t in ("orders", "customers")}
    return lake, config, ends


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is needed for the report's browser test (infra/setup.sh installs it)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox"])
        yield b
        b.close()


def visible_rows(page, section: str) -> list[list[str]]:
    """The cells of the table under heading ``section``, as seen on screen (header row excluded)."""
    table = page.locator(f"h2#{section} ~ table").first
    assert table.is_visible()
    rows = table.locator("tr").all()[1:]
    return [[c.inner_text().strip() for c in row.locator("td").all()] for row in rows]


def test_quality_runs_keep_each_finding_typed(shop):
    """The findings are typed rows in quality_runs (key, topic, records and offsets, placements): the
    report renders them without reading them back out of the sentences."""
    lake, _, _ = shop
    rows = sorted(lake.read_arrow(QUALITY_RUNS).to_pylist(), key=lambda r: r["run_time"])
    first = {r["check"]: r for r in rows[:4]}
    second = {r["check"]: r for r in rows[4:]}
    missing = {f["key"]: f for f in first["completeness:orders->customers"]["findings"]}
    assert sorted(missing) == ["user_10", "user_3", "user_4"]
    where = "referenced by 2 record(s) of orders, first at partition 1 offset 0, last at partition 1 offset 1"
    assert missing["user_10"] == {
        "text": f"user_10 ({where})",
        "problem": where,
        "key": "user_10",
        "key_hex": "757365725F3130",
        "topic": "orders",
        "records": 2,
        "offsets": [{"partition": 1, "offset": 0}, {"partition": 1, "offset": 1}],
        "placements": [],
    }
    misplaced = second["co_partitioning:orders+customers"]["findings"]
    assert [(f["key"], f["placements"]) for f in misplaced] == [
        (
            key,
            [
                {
                    "topic": "customers",
                    "partitions": [at],
                    "expected_partition": want,
                    "partitioner": "murmur2",
                }
            ],
        )
        for key, at, want in (("user_10", 0, 1), ("user_3", 0, 2), ("user_4", 3, 2))
    ]
    assert [f["text"] for f in misplaced] == second["co_partitioning:orders+customers"]["offending_sample"]


def test_report_page_shows_what_failed_as_a_person_sees_it(shop, browser, tmp_path):
    lake, config, ends = shop
    path = lake.layout.report_folder.pipeline_page("shop")
    assert path.is_file()
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    page.goto(path.as_uri())

    assert page.title() == "Data quality report: shop"
    assert page.locator("h1").inner_text() == "Data quality report: pipeline shop"
    status = page.locator("#status")
    assert status.is_visible()
    assert status.inner_text() == "FAILING: 1 of 4 expectations failed in the latest run of their suite."

    # the latest run only: completeness now passes, key placement fails with 3 keys
    latest = visible_rows(page, "latest")
    assert [row[-3:-1] for row in latest] == [
        ["PASSED", "0"],
        ["PASSED", "0"],
        ["FAILED", "3"],
        ["PASSED", "0"],
    ]
    # each check names the topics' offsets it read from Kafka, as the run started
    read = [row[-1].split("\ntaken ")[0] for row in latest]
    both = f"orders up to offsets {ends['orders']}\ncustomers up to offsets {ends['customers']}"
    assert read == [both, both, both, f"customers up to offsets {ends['customers']}"]
    assert latest[0][0] == "shop_lookups (v1)"
    assert latest[0][2].startswith("completeness:orders->customers")

    # missing keys are those of the latest run: none any more
    assert page.locator("h2#missing + p").inner_text() == "None: every referenced key exists in its lookup."

    # each with why, in the words of `lake explain` (the pipeline has no join to name)
    def why(partition: int, home: int, written: str) -> str:
        return (
            f"MISPLACED: in partition {partition}, but murmur2 (the topic's partitioner) puts this key in "
            f"partition {home} (written with {written}): the product's joins find it, a Kafka Streams or ksqlDB join "
            "of the topic misses it; fix: lake topic repartition customers"
        )

    assert visible_rows(page, "misplaced") == [
        ["user_10", "customers", "0", "1", "murmur2", why(0, 1, "consistent_random")],
        ["user_3", "customers", "0", "2", "murmur2", why(0, 2, "consistent_random")],
        ["user_4", "customers", "3", "2", "murmur2", why(3, 2, "consistent_random")],
    ]

    assert page.locator("h2#quarantine + p").inner_text() == (
        "1 record(s) rejected by this pipeline's backfills and joins."
    )
    (q,) = visible_rows(page, "quarantine")
    assert q[1:] == [
        "backfill:customers",
        f"{lake.layout.work.parent / 'dump.txt'}:3",
        "no separator '|'",
        "broken line",
    ]

    # the chart: one bar per run, both runs failed one expectation, each visible with its tooltip
    bars = page.locator("svg#failures-chart rect.run")
    assert bars.count() == 2
    assert all(bars.nth(i).is_visible() for i in range(2))
    assert [bars.nth(i).get_attribute("data-failed") for i in range(2)] == ["1", "1"]
    assert bars.nth(1).locator("title").text_content().endswith(": 1 of 4 failed")
    box = page.locator("svg#failures-chart").bounding_box()
    assert box and box["width"] > 300 and box["height"] > 100

    # the links lead somewhere real: the run's own page and Great Expectations Data Docs
    page.locator("h2#latest ~ table a").first.click()
    assert page.locator("h1").inner_text() == "Data quality: pipeline shop"
    page.go_back()
    page.locator("#data-docs").click()
    assert page.title() == "Data Docs created by Great Expectations"
    # Data Docs' index fills its list of validations with scripts from public CDNs (jQuery,
    # bootstrap-table); without network access only its frame renders, which is what is checked here.
    # The findings themselves are on the report page above, which needs nothing from outside.
    assert "Validation Results" in page.locator("body").inner_text()
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)

    # the index: a section per pipeline with its status, its failing check and first findings
    page.goto((path.parent / "index.html").as_uri())
    section = page.locator("section#pipeline-shop")
    assert section.locator("h2").inner_text() == "shop"
    assert section.locator(".status").inner_text() == (
        "FAILING: 1 of 4 expectations failed in the latest run of their suite."
    )
    (failing,) = section.locator("ul.failing li").all_inner_texts()
    assert failing == (
        "co_partitioning:orders+customers: "
        "user_10: in customers at partition 0 but murmur2 places it in 1; different partitions: orders=1, "
        "customers=0; user_3: in customers at partition 0 but murmur2 places it in 2; different partitions: "
        "orders=2, customers=0; user_4: in customers at partition 3 but murmur2 places it in 2; different "
        "partitions: orders=2, customers=3"
    )
    section.locator("h2 a").click()
    assert page.title() == "Data quality report: shop"
    page.close()


def test_report_of_a_pipeline_without_runs_says_so(tmp_path, browser):
    (tmp_path / "p.yaml").write_text(CONFIG)
    (tmp_path / "suite.yaml").write_text(SUITE)
    (tmp_path / "dump.txt").write_bytes(DUMP)
    lake = Lake(tmp_path / "lake")
    path = write_report(lake, load_config(tmp_path / "p.yaml"))
    page = browser.new_page()
    page.goto(path.as_uri())
    assert page.locator("#status").inner_text() == "No quality run yet for this pipeline."
    assert page.locator("h2#quarantine + p").inner_text() == (
        "None: no input line or record of this pipeline was rejected."
    )
    assert page.locator("svg#failures-chart").count() == 0
    index = path.parent / "index.html"
    page.goto(index.as_uri())
    assert page.locator("section.pipeline h2 a").all_inner_texts() == ["shop"]
    assert (
        page.locator("section#pipeline-shop .status").inner_text() == "No quality run yet for this pipeline."
    )
    page.close()
