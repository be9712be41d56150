"""`lake status` as a user reads it, through the CLI on a fresh lake root: the records a stream join
dropped for a null key (KIP-962's skipped count), and a lookup table behind its topic."""

from __future__ import annotations

import pytest

from spark_jobs.cli import main

PIPELINE = """
pipeline: status
topics:
  events: {partitions: 2}
  profiles: {partitions: 2}
lookups:
  profiles: {topic: profiles, joined_with: [events]}
joins:
  st_inner: {kind: stream-table, left: events, right: profiles, type: inner, select: {page: left.page, name: right.name}}
"""


@pytest.fixture
def lake(tmp_path, capsys):
    (tmp_path / "p.yaml").write_text(PIPELINE)
    where = ["--root", str(tmp_path / "lake"), "--config", str(tmp_path / "p.yaml")]

    def run(*args: str, lines: str | None = None) -> tuple[int, str, str]:
        if lines is not None:
            (tmp_path / "in.txt").write_text(lines)
            args = (*args, str(tmp_path / "in.txt"))
        capsys.readouterr()
        code = main([*args, *where])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_status_counts_the_events_an_inner_stream_join_skipped_for_a_null_key(spark, lake):
    assert lake("produce", "profiles", "-K", ";", lines='u1;{"name": "Ann"}\n')[0] == 0
    events = 'u1;{"page": "/home"}\n;{"page": "/anon"}\n;{"page": "/faq"}\n'  # two with a null key (-Z)
    code, _, err = lake("produce", "events", "-K", ";", "-Z", lines=events)
    assert code == 0, err
    code, out, err = lake("run", "st_inner", "--once")
    assert code == 0, err
    code, out, _ = lake("status")
    (line,) = [line for line in out.splitlines() if line.startswith("st_inner (stream-table)")]
    assert line.endswith(" pending, 2 skipped (null key)"), line
    assert "; last batch " in line and ": 4 in, 1 out, " in line, line


def test_status_says_how_far_a_lookup_table_is_behind_its_topic(spark, lake):
    assert lake("produce", "profiles", "-K", ";", lines='u1;{"name": "Ann"}\nu2;{"name": "Bob"}\n')[0] == 0
    code, _, err = lake("ingest")
    assert code == 0, err
    code, out, _ = lake("status")
    (line,) = [line for line in out.splitlines() if line.startswith("lookup profiles")]
    assert line.endswith(", 0 records behind profiles"), line
    # two records and their transaction's commit marker reach the topic, not the lookup table
    assert (
        lake("produce", "profiles", "-K", ";", lines='u1;{"name": "Ann B"}\nu1;{"name": "Ann C"}\n')[0] == 0
    )
    code, out, _ = lake("status")
    (line,) = [line for line in out.splitlines() if line.startswith("lookup profiles")]
    assert line.endswith(", 3 records behind profiles; 'lake ingest' brings it up to the topic"), line
    assert lake("ingest")[0] == 0
    code, out, _ = lake("status", "--json")
    import json

    (lookup,) = json.loads(out.splitlines()[0])["lookups"]
    assert (lookup["lookup"], lookup["behind"], lookup["up_to"]) == ("profiles", 0, lookup["ends"])
