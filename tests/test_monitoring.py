"""infra/monitoring: the alert rules pass promtool's check and its unit tests, the scrape config is
valid, and every series the rules and the Grafana dashboard read is one the jobs serve."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import yaml
from joinkit import write_config

from spark_jobs.joins.engine import BatchMetrics
from spark_jobs.runtime.metrics import IngestMetrics, JoinMetrics

REPO = Path(__file__).resolve().parents[1]
MONITORING = REPO / "infra" / "monitoring"
PROMTOOL = REPO / ".tools" / "bin" / "promtool"
SERIES_RE = re.compile(r"\b(lake_[a-z_]+)")
PIPELINE = """
pipeline: shop
topics:
  L: {partitions: 1}
  R: {partitions: 1}
joins:
  j: {kind: fk, left: L, right: R, foreign_key: r, select: {v: left.v}, publish: true}
"""


def promtool(*args: str) -> str:
    assert PROMTOOL.exists(), f"{PROMTOOL} is missing: make setup fetches it (infra/setup.sh, promtool)"
    done = subprocess.run([str(PROMTOOL), *args], cwd=MONITORING, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_alert_rules_pass_promtools_check_and_unit_tests():
    assert "SUCCESS: 4 rules found" in promtool("check", "rules", "alerts.yml")
    assert "SUCCESS" in promtool("test", "rules", "alerts_test.yml")
    assert "is valid prometheus config file syntax" in promtool("check", "config", "prometheus.yml")


def served_series(tmp_path, lake) -> set[str]:
    """The names of every series a join and the ingest serve (a histogram's and counter's samples)."""
    from spark_jobs.seams.kafka import connect

    config = write_config(tmp_path, PIPELINE)
    cluster = connect(config, lake.root)
    join = JoinMetrics(config, config.join("j"), cluster, lambda: {}, lake.layout)
    ingest = IngestMetrics(config, cluster, {"L": 1, "R": 1}, lambda: {})
    progress = {"name": "join_j", "batchId": 1, "durationMs": {"addBatch": 5}, "stateOperators": [{}]}
    join.progress(SimpleNamespace(lastProgress=progress), join.labels)
    batch = BatchMetrics(input_left=2, upserted=1)
    with batch.phases("read+state"):
        pass
    join.batch(batch, 0.5, 0)
    runs = lake.layout.report_folder.path / "runs"
    runs.mkdir(parents=True)
    (runs / "1.json").write_text(
        json.dumps({"pipeline": "shop", "success": True, "run_time": "2026-11-29T00:00:00Z"})
    )
    names = set()
    for endpoint in (join, ingest):
        for family in endpoint.registry.collect():
            names |= {s.name for s in family.samples} | {family.name}
    return names


def test_the_rules_and_the_dashboard_read_only_series_the_jobs_serve(tmp_path, lake):
    served = served_series(tmp_path, lake)
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    used = {name for e in exprs for name in SERIES_RE.findall(e)}
    assert used - served == set()
    # every panel has a query, and the panels do not overlap
    assert all(p["targets"] for p in dashboard["panels"])
    cells = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in dashboard["panels"]]
    assert len(cells) == len(set(cells))
    # the series the rules alert on are among them
    assert {"lake_join_lag_seconds", "lake_join_dropped_records_total", "lake_quality_gate_passed"} <= used
