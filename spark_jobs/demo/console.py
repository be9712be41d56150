"""The demo told step by step on the console (``lake demo``): the consents story (topics, the quality
gate failing, the backfill, the gate passing, the joins, the audit) and the keyed stories."""

from __future__ import annotations

import sys

from spark_jobs.config import PipelineConfig
from spark_jobs.errors import UserError
from spark_jobs.seams.delta import Lake


def tell(stories: list[str], config: PipelineConfig, lake: Lake, topics_only: bool = False) -> int:
    """Tell ``stories`` (``consents``, the default, and the keyed stories by name); ``config`` is
    the consents story's pipeline. 0 when every story ran and its audit is clean."""
    from spark_jobs.demo.stories import STORIES

    stories = stories or ["consents"]
    for name in stories:
        if name != "consents" and name not in STORIES:
            known = ", ".join(["consents", *STORIES])
            raise UserError(f"unknown demo story '{name}' (known: {known})")
    status = 0
    if "consents" in stories:
        status = _demo_consents(config, lake, topics_only)
    keyed = [STORIES[s] for s in stories if s != "consents"]
    if keyed and topics_only:
        from spark_jobs.demo.stories import write_story_topics
        from spark_jobs.formats import Formats
        from spark_jobs.seams.kafka import connect

        for story in keyed:
            story_config = story.config()
            cluster = connect(story_config, lake.root)
            formats = Formats(story_config, lake.root, cluster.topic)
            written = write_story_topics(story, cluster, formats)
            print(
                f"{story.name}: "
                + ("topics written" if written else "topics already have records, left as they are")
            )
    elif keyed and status == 0:
        status = _demo_stories(lake, keyed)
    return status


def _demo_stories(lake: Lake, stories) -> int:
    """The foreign-key, derive and list joins on small readable data, step by step."""
    from spark_jobs.demo.stories import run_story
    from spark_jobs.joins.oracle import audit
    from spark_jobs.joins.runner import run_join
    from spark_jobs.seams.session import get_spark
    from spark_jobs.show import render, table_rows

    print(f"lake root: {lake.root}", flush=True)
    print("(starting Spark for the quality suites, the backfills and the joins ...)", flush=True)
    spark = get_spark(app_name="demo", root=lake.root)

    def run(config, name: str) -> None:
        summary = run_join(spark, lake, config, name, once=True, log=_batch_line)
        if summary.batches == 0:
            print(f"join {name}: nothing new", flush=True)

    def show(name: str, columns: list[str]) -> None:
        _, rows = table_rows(lake, name)
        rows = [{c: _demo_cell(v) for c, v in row.items()} for row in rows]
        for line in render(columns, rows, as_json=False):
            print("  " + line.replace("\t", "  |  "))

    def gate(config) -> bool:
        return _gate(spark, lake, config, lambda text: print(f"\n-- {config.name}: {text}", flush=True))

    clean = True
    for story in stories:
        print(f"\n== the {story.name} pipeline ({story.pipeline})", flush=True)
        config = run_story(story, lake, gate, run, show)
        if config is None:
            return 1
        for name in story.show:
            report = audit(spark, lake, config, name)
            print(report.text())
            clean = clean and report.clean
    return 0 if clean else 1


def numbered(first: int):
    """Headings ``== N. text`` from ``first`` on (the consents story's numbering)."""
    n = iter(range(first, 100))
    return lambda text: print(f"\n== {next(n)}. {text}", flush=True)


def _gate(spark, lake, config, heading) -> bool:
    """What the pipeline DAG does before its joins start, told on the console: the quality suites
    (failing while a lookup misses referenced entities), the backfill of each lookup from its dump,
    the suites again, and the gate's verdict."""
    from spark_jobs.lookups.backfill import run_backfill
    from spark_jobs.quality.run import run_suites

    def check(step: str) -> bool:
        heading(step)
        report = run_suites(spark, lake, config, log=lambda m: None)
        for r in report.results:
            print(f"{'PASS' if r.success else 'FAIL'}  {r.check}: {r.description}")
        print(f"report: {report.summary_html}")
        print(f"Data Docs: {report.data_docs}")
        return report.success

    check("quality suites before the backfill")
    for name, lookup in config.lookups.items():
        if lookup.backfill.source is None:
            continue
        heading(f"backfill the {name} lookup from the database dump")
        summary = run_backfill(spark, lake, config, name, missing_only=True, log=lambda m: None)
        print(summary.text())
    passed = check("quality suites after the backfill")
    print(
        f"\nThe gate of {config.name} "
        + ("passes: its streaming joins may start." if passed else "still FAILS: no join starts.")
    )
    return passed


def _batch_line(line: str) -> None:
    if " batch " in line:
        print("  " + line, flush=True)


def _demo_cell(value):
    """A result cell for the demo's tables: an enriched list as `id: fields` items."""
    from spark_jobs.show import shown

    if isinstance(value, list):
        items = []
        for e in value:
            fields = [str(v) for k, v in e.items() if k not in ("id", "matched") and v is not None]
            items.append(f"{e['id']}: {', '.join(fields)}" if e.get("matched") else f"{e['id']}: (unknown)")
        return "[" + "; ".join(items) + "]"
    return "null" if value is None else shown(value)


def _demo_consents(config: PipelineConfig, lake: Lake, topics_only: bool) -> int:
    """The product's main job on the embedded default: topics -> quality gate (fails: the lookup
    misses old customers) -> backfill -> quality gate (passes)."""
    from spark_jobs.demo import data
    from spark_jobs.formats import Formats
    from spark_jobs.seams.kafka import connect
    from spark_jobs.seams.session import get_spark
    from spark_jobs.topics.produce_consume import Rendering, consume

    cluster = connect(config, lake.root)
    print(f"lake root: {lake.root}, Kafka: {cluster.bootstrap_servers} ({cluster.origin})")
    print("\n== 1. topics on Kafka (written with murmur2_random, the Java client's placement)")
    formats = Formats(config, lake.root, cluster.topic)
    for topic, result in data.write_demo_topics(cluster, formats):
        if result is None:
            print(f"{topic}: already has records, left as it is")
        else:
            placed = ", ".join(f"p{i}={n}" for i, n in enumerate(result.per_partition))
            print(f"{topic}: produced {result.records} records to Kafka topic {result.topic} [{placed}]")
    for topic in (data.CONSENTS_TOPIC, data.ACCOUNTS_TOPIC):
        spec = config.topic(topic)
        if spec.registered:
            subject = formats.codec(topic, "value").subject  # type: ignore[attr-defined]
            print(f"-- {topic} (key, partition, offset, schema id: value), {spec.value_format} records of "
                  f"subject {subject} as a consumer with the registry's deserializer reads them")  # fmt: skip
            fmt, render = (
                "%k\\t%p\\t%o\\t%i\\t%s\\n",
                Rendering((formats.codec(topic, "key"), formats.codec(topic, "value"))),
            )
        else:
            print(f"-- {topic} (key, partition, offset: value), as any Kafka consumer reads it")
            fmt, render = "%k\\t%p\\t%o\\t%s\\n", Rendering()
        sys.stdout.flush()
        consume(cluster, spec, sys.stdout.buffer, fmt=fmt, render=render)
    if topics_only:
        return 0

    print("\n(starting Spark for the quality suites, the backfill and the joins ...)", flush=True)
    spark = get_spark(app_name="demo", root=lake.root)

    passed = _gate(spark, lake, config, numbered(2))
    if not passed:
        return 1
    return _demo_joins(spark, lake, config)


def _demo_joins(spark, lake, config) -> int:
    """The demo's joins, run after the gate: the table-table join carries every e-mail; the
    stream-table join shows why backfills come first."""
    from spark_jobs.demo import data
    from spark_jobs.formats import Formats
    from spark_jobs.joins.oracle import audit
    from spark_jobs.joins.runner import run_join
    from spark_jobs.seams.kafka import connect
    from spark_jobs.show import render, table_rows

    def run(name: str) -> None:
        summary = run_join(spark, lake, config, name, once=True)
        print(summary.text(), flush=True)

    def show(name: str, columns: list[str]) -> None:
        _, rows = table_rows(lake, name)
        rows = [{c: "null" if v is None else v for c, v in row.items()} for row in rows]
        for line in render(columns, rows, as_json=False):
            print("  " + line.replace("\t", "  "))

    print("\n== 5. table-table join consents_with_mail (left join of consents with accounts)", flush=True)
    run(data.WITH_MAIL)
    show(data.WITH_MAIL, ["key", "retargeter1", "retargeter2", "contactMailAddress"])
    print("Every consent carries the e-mail, user_9 and user_10 included: a table-table join uses the")
    print("latest value of both sides, so the backfilled accounts completed it.")

    print("\n== 6. stream-table join consents_enriched_at_event_time (as of each event's time)", flush=True)
    run(data.AT_EVENT_TIME)
    show(data.AT_EVENT_TIME, ["key", "timestamp", "contactMailAddress"])
    print("user_9 and user_10 have no e-mail: their accounts were backfilled after these consent")
    print("events happened, and a stream-table join never revisits an event. Backfill first, then")
    print("start the stream. A consent event that arrives now, after the backfill, is enriched:")
    cluster = connect(config, lake.root)
    if data.write_late_consent(cluster, Formats(config, lake.root, cluster.topic)):
        run(data.AT_EVENT_TIME)
    show(data.AT_EVENT_TIME, ["key", "timestamp", "contactMailAddress"])

    print("\n== 7. audit: each result against a batch join of the topics", flush=True)
    clean = True
    for name in (data.WITH_MAIL, data.AT_EVENT_TIME):
        report = audit(spark, lake, config, name)
        print(report.text())
        clean = clean and report.clean
    return 0 if clean else 1
