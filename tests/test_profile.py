"""Where a micro-batch's time goes: named phases add up, and a query progress reads as one line."""

from types import SimpleNamespace

from spark_jobs.runtime.profile import Phases, profile_line, profiling


def test_phases_add_up_in_the_order_they_first_ran():
    phases = Phases()
    for name in ("read", "state", "read"):
        with phases(name):
            pass
    assert list(phases.ms) == ["read", "state"]
    assert phases.text().startswith("read ") and ", state " in phases.text()


def test_a_progress_as_a_profile_line(monkeypatch):
    progress = SimpleNamespace(
        name="join:orders",
        batchId=7,
        timestamp="2026-11-27T06:00:00.250Z",
        numInputRows=12,
        durationMs={"triggerExecution": 640, "addBatch": 510},
    )
    assert profile_line(progress) == (
        'profile join:orders batch 7 at 1795759200.250 rows 12 ms {"addBatch": 510, "triggerExecution": 640}'
    )
    monkeypatch.setenv("LAKE_PROFILE", "1")
    assert profiling()
    monkeypatch.setenv("LAKE_PROFILE", "0")
    assert not profiling()
