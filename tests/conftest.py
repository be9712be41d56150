"""Shared fixtures: one Spark session for the whole run, a fresh lake root per test."""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("LAKE_SHUFFLE_PARTITIONS", "2")


@pytest.fixture(scope="session")
def spark():
    from spark_jobs.session import get_spark

    session = get_spark(app_name="lake-tests")
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path):
    from spark_jobs.lake import Lake

    return Lake(tmp_path / "lake")


@pytest.fixture
def demo_config():
    from spark_jobs.config import load_config

    return load_config(None)


@pytest.fixture(autouse=True)
def _no_ambient_lake_env(monkeypatch):
    """Tests never pick up a developer's LAKE_ROOT / LAKE_CONFIG."""
    monkeypatch.delenv("LAKE_ROOT", raising=False)
    monkeypatch.delenv("LAKE_CONFIG", raising=False)


_exit_status: list[int] = []


def pytest_sessionfinish(session, exitstatus):
    _exit_status.append(int(exitstatus))


def pytest_unconfigure(config):
    """Leave with pytest's own exit status once it has reported everything.

    Arrow's and delta-rs's native thread pools can abort the process during interpreter teardown,
    after all work is done ("terminate called without an active exception": apache/arrow#34314,
    delta-io/delta-rs#2184); the `lake` CLI exits the same way for the same reason. The result of the
    run is already decided and printed at this point; nothing is hidden."""
    if _exit_status and os.environ.get("LAKE_TEST_NORMAL_EXIT") != "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])
