"""What a quality run answers: each expectation's result with its findings and the offsets it read,
and the run's report (``summary.json``, the run's page, the quality gate in Airflow)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from spark_jobs.quality.findings import Finding
from spark_jobs.topics.snapshots import offsets_text


@dataclass
class ExpectationResult:
    suite: str
    check: str
    expectation: str
    description: str
    success: bool
    observed_value: str
    offending_total: int = 0
    findings: list[Finding] = field(default_factory=list)  # the first LIST_LIMIT
    # what the check read: its topics' end offsets (per partition) in the run's snapshot
    offsets: dict[str, list[int]] = field(default_factory=dict)

    @property
    def offending(self) -> list[str]:
        """The findings in words, one line each."""
        return [f.text for f in self.findings]


@dataclass
class QualityReport:
    run_id: str
    run_time: str
    pipeline: str
    success: bool
    results: list[ExpectationResult]
    data_docs: str | None
    summary_html: str | None
    # the run's snapshot: when its offsets were taken and, per topic, its end offset per partition
    offsets_at: str = ""
    offsets: dict[str, list[int]] = field(default_factory=dict)

    def covers(self) -> str:
        """``orders up to offsets [3, 2]; customers up to offsets [1, 0] (taken ...)``."""
        parts = [offsets_text(t, e) for t, e in self.offsets.items()]
        return f"{'; '.join(parts)} (taken {self.offsets_at})"

    def as_dict(self) -> dict:
        return asdict(self)
