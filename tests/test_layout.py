"""The lake root's layout: every path and table name is spelled in spark_jobs/layout.py, and the
names the lake keeps for itself are refused to topics, lookups and joins."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.layout import (
    JOIN_PARTS,
    SYSTEM_TABLES,
    Layout,
    former_pending_table,
    is_reserved,
    join_table,
    lookup_table,
)


def test_every_path_is_under_the_root_where_the_docs_say():
    layout = Layout(Path("/lake"))
    assert {
        "table": layout.table("orders"),
        "join checkpoint": layout.join_checkpoint("j"),
        "join inputs": layout.join_inputs("j"),
        "driver checkpoint": layout.driver_checkpoint("j"),
        "ingest checkpoint": layout.ingest_checkpoint("orders"),
        "ingest start": layout.ingest_start("orders"),
        "job entry": layout.job_entry("join_j"),
        "job lock": layout.job_lock("join_j"),
        "job log": layout.job_log("join_j"),
        "job last batch": layout.job_last_batch("join_j"),
        "lock": layout.lock("ingest-orders"),
        "repair": layout.repair_marker("orders"),
        "broker state": layout.broker_state,
        "broker log": layout.broker_log,
        "broker data": layout.broker_data,
        "broker config": layout.broker_config,
        "broker log config": layout.broker_log_config,
        "broker output": layout.broker_output,
        "connect state": layout.connect_state,
        "connect log": layout.connect_log,
        "connect warm-up": layout.connect_warm_up,
        "airflow run": layout.airflow_run("d", "r"),
        "alerts": layout.alerts,
        "report": layout.report_folder.pipeline_page("shop"),
    } == {
        "table": Path("/lake/tables/orders"),
        "join checkpoint": Path("/lake/_checkpoints/j"),
        "join inputs": Path("/lake/_checkpoints/j/lake-inputs.json"),
        "driver checkpoint": Path("/lake/_checkpoints/.driver/j"),
        "ingest checkpoint": Path("/lake/_checkpoints/ingest/orders"),
        "ingest start": Path("/lake/_checkpoints/ingest/orders.start.json"),
        "job entry": Path("/lake/_jobs/join_j.json"),
        "job lock": Path("/lake/_jobs/join_j.lock"),
        "job log": Path("/lake/_jobs/join_j.log"),
        "job last batch": Path("/lake/_jobs/join_j.last.json"),
        "lock": Path("/lake/_locks/ingest-orders.lock"),
        "repair": Path("/lake/_repair/orders.json"),
        "broker state": Path("/lake/_kafka/broker.json"),
        "broker log": Path("/lake/_kafka/broker.log"),
        "broker data": Path("/lake/_kafka/data"),
        "broker config": Path("/lake/_kafka/server.properties"),
        "broker log config": Path("/lake/_kafka/log4j2.properties"),
        "broker output": Path("/lake/_kafka/broker.out"),
        "connect state": Path("/lake/_connect/server.json"),
        "connect log": Path("/lake/_connect/server.log"),
        "connect warm-up": Path("/lake/_connect/warm-up"),
        "airflow run": Path("/lake/_airflow/d/r"),
        "alerts": Path("/lake/_airflow/alerts.jsonl"),
        "report": Path("/lake/reports/quality/shop.html"),
    }


def test_table_names_and_the_names_they_reserve():
    assert lookup_table("accounts") == "lookup_accounts"
    assert [join_table("j", part) for part in JOIN_PARTS] == [
        "j__parked",
        "j__waiting",
        "j__right_history",
        "j__left_buffer",
        "j__right_buffer",
        "j__progress",
    ]
    assert former_pending_table("j") == "j__pending"
    with pytest.raises(KeyError, match="no join table part 'pending'"):
        join_table("j", "pending")
    for name in (*SYSTEM_TABLES, "lookup_accounts", "j__parked", "a__b"):
        assert is_reserved(name), name
    for name in ("orders", "lookups", "my_lookup", "a_b"):
        assert not is_reserved(name), name


def test_join_tables_lists_what_a_join_owns_and_nothing_of_another_join(tmp_path):
    layout = Layout(tmp_path)
    assert layout.join_tables("j") == []  # no tables folder yet
    for name in ("j", "j__parked", "j__progress", "jj__parked", "j_other"):
        (layout.tables / name).mkdir(parents=True)
    assert [p.name for p in layout.join_tables("j")] == ["j__parked", "j__progress"]


def test_a_report_folder_names_its_pages(tmp_path):
    from datetime import UTC, datetime

    folder = Layout(Path("/lake")).report_folder
    assert folder.path == Path("/lake/reports/quality")
    at = datetime(2026, 11, 27, 6, 5, 4, tzinfo=UTC)
    assert {
        "index": folder.index,
        "summary": folder.summary,
        "summary json": folder.summary_json,
        "pipeline": folder.pipeline_page("consents"),
        "run": folder.run_page(at, "0123456789abcdef"),
        "data docs": folder.data_docs_index,
    } == {
        "index": Path("/lake/reports/quality/index.html"),
        "summary": Path("/lake/reports/quality/summary.html"),
        "summary json": Path("/lake/reports/quality/summary.json"),
        "pipeline": Path("/lake/reports/quality/consents.html"),
        "run": Path("/lake/reports/quality/runs/20261127T060504Z-01234567.html"),
        "data docs": Path("/lake/reports/quality/gx/uncommitted/data_docs/local_site/index.html"),
    }
    assert folder.href(folder.run_page(at, "0123456789abcdef")) == "runs/20261127T060504Z-01234567.html"
    assert Layout(Path("/lake")).dbt_target == Path("/lake/dbt/target")

    real = Layout(tmp_path).report_folder
    real.path.mkdir(parents=True)
    for page in (real.index, real.summary, real.pipeline_page("people"), real.pipeline_page("consents")):
        page.write_text("")
    assert real.pipeline_pages() == [real.pipeline_page("consents"), real.pipeline_page("people")]
