"""The registry of engines: one engine class per join kind, each with its own oracle."""

from spark_jobs.join_kinds import KINDS
from spark_jobs.joins.registry import JOBS


def test_every_join_kind_has_exactly_one_engine_and_one_oracle():
    """A kind the engine or the oracle does not know is a KeyError at once, never another kind's code:
    each engine class writes its own oracle (``expected``), none inherits another kind's."""
    assert set(JOBS) == set(KINDS)
    for kind, job in JOBS.items():
        assert "expected" in vars(job), f"join kind {kind} has no oracle of its own"
