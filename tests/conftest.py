"""Shared fixtures: one Spark session for the whole run, a fresh lake root per test."""

from __future__ import annotations

import os

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
