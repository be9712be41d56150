"""KIP-962 through the public test driver: a record with a null key is an event in a stream join's
streams (a left or outer join emits it unmatched at once, an inner join skips it and counts it), and
a fault wherever the join keeps a table by key (quarantined, as Kafka refuses to store it): table
(inner, left, outer), fk (inner, left), list and derive."""

from __future__ import annotations

import pytest

from spark_jobs.testing import PipelineTestDriver

PIPELINE = """
pipeline: null-keys
topics:
  events: {partitions: 2}
  clicks: {partitions: 2}
  profiles: {partitions: 2}
joins:
  st_left: {kind: stream-table, left: events, right: profiles, type: left, select: {page: left.page, name: right.name}, publish: true}
  st_inner: {kind: stream-table, left: events, right: profiles, type: inner, select: {page: left.page, name: right.name}}
  ss_inner: {kind: stream-stream, left: events, right: clicks, type: inner, window: 10 seconds, select: {page: left.page, what: right.what}}
  ss_left: {kind: stream-stream, left: events, right: clicks, type: left, window: 10 seconds, select: {page: left.page, what: right.what}, publish: true}
  ss_outer: {kind: stream-stream, left: events, right: clicks, type: outer, window: 10 seconds, select: {page: left.page, what: right.what}}
  t_left: {kind: table, left: events, right: profiles, type: left, select: {page: left.page, name: right.name}}
  by_profile: {kind: fk, left: events, right: profiles, foreign_key: profile, type: left, select: {page: left.page, name: right.name}}
  t_inner: {kind: table, left: events, right: profiles, type: inner, select: {page: left.page, name: right.name}}
  t_outer: {kind: table, left: events, right: profiles, type: outer, select: {page: left.page, name: right.name}}
  by_profile_inner: {kind: fk, left: events, right: profiles, foreign_key: profile, type: inner, select: {page: left.page, name: right.name}}
  with_friends: {kind: list, left: events, right: profiles, list: friends, type: left, select: {page: left.page}, elements: {name: right.name}}
  by_name: {kind: derive, left: profiles, key: name, select: {id: "cast(master_key as string)"}}
"""


@pytest.fixture(scope="module")
def driven(spark, tmp_path_factory):
    """One advance with null-key records on every topic, next to keyed ones; the driver kept open."""
    tmp = tmp_path_factory.mktemp("null-keys")
    (tmp / "pipeline.yaml").write_text(PIPELINE)
    with PipelineTestDriver(tmp / "pipeline.yaml", root=tmp / "lake", spark=spark) as d:
        d.pipe("profiles", key="u1", value={"name": "Ann"}, timestamp=1000)
        d.pipe("profiles", key=None, value={"name": "Nobody"}, timestamp=1000)
        d.pipe(
            "events", key="u1", value={"page": "/home", "profile": "u1", "friends": ["u1"]}, timestamp=2000
        )
        d.pipe(
            "events", key=None, value={"page": "/anon", "profile": "u1", "friends": ["u1"]}, timestamp=3000
        )
        d.pipe("clicks", key="u1", value={"what": "buy"}, timestamp=2500)
        d.pipe("clicks", key=None, value={"what": "ad"}, timestamp=4000)
        d.advance()
        yield d


def test_a_left_stream_table_join_emits_a_null_key_event_at_once_unmatched(driven):
    d = driven
    expected = [("u1", {"page": "/home", "name": "Ann"}, 2000), (None, {"page": "/anon", "name": None}, 3000)]
    assert sorted(d.changes("st_left"), key=lambda r: r.timestamp) == expected
    assert sorted(d.changelog("st_left"), key=lambda r: r.timestamp) == expected
    # the profile with a null key cannot be in the table: quarantined with its reason
    assert [(reason.split(" (")[0]) for _, _, reason in d.quarantined("st_left")] == ["null key"]
    assert d.queries["st_left"].metrics.skipped == 0


def test_an_inner_stream_table_join_skips_a_null_key_event_and_counts_it(driven):
    d = driven
    assert d.changes("st_inner") == [("u1", {"page": "/home", "name": "Ann"}, 2000)]
    assert d.queries["st_inner"].metrics.skipped == 1
    # the profile's, and the skipped event: every record the join does not use is in the quarantine
    assert sorted(reason for _, _, reason in d.quarantined("st_inner")) == [
        "null key",
        "null key: an event without a key, which the inner join drops",
    ]


def test_stream_stream_joins_emit_null_key_events_unmatched_by_the_sides_they_keep(driven):
    d = driven
    pair = ("u1", {"page": "/home", "what": "buy"}, 2500)  # a pair's time: the later record's
    assert d.changes("ss_inner") == [pair]
    assert d.queries["ss_inner"].metrics.skipped == 2  # one event, one click
    left = [pair, (None, {"page": "/anon", "what": None}, 3000)]
    assert sorted(d.changes("ss_left"), key=lambda r: r.timestamp) == left
    assert sorted(d.changelog("ss_left"), key=lambda r: r.timestamp) == left
    assert d.queries["ss_left"].metrics.skipped == 1  # the click: a left join drops right-only events
    outer = [*left, (None, {"page": None, "what": "ad"}, 4000)]
    assert sorted(d.changes("ss_outer"), key=lambda r: r.timestamp) == outer
    assert d.queries["ss_outer"].metrics.skipped == 0
    # the skipped events are quarantined, each at its topic and offset
    skipped = {
        name: sorted((source.split("[")[0], reason) for source, _, reason in d.quarantined(name))
        for name in ("ss_inner", "ss_left", "ss_outer")
    }
    assert skipped == {
        "ss_inner": [
            ("clicks", "null key: an event without a key, which the inner join drops"),
            ("events", "null key: an event without a key, which the inner join drops"),
        ],
        "ss_left": [("clicks", "null key: an event without a key, which the left join drops")],
        "ss_outer": [],
    }


def test_table_kinds_quarantine_null_keys(driven):
    d = driven
    assert d.changes("t_left") == [("u1", {"page": "/home", "name": "Ann"}, 2000)]
    assert sorted(reason for _, _, reason in d.quarantined("t_left")) == ["null key", "null key"]
    assert d.changes("by_profile") == [("u1", {"page": "/home", "name": "Ann"}, 2000)]
    # the event's and the profile's: a foreign-key join keeps both sides by key
    assert sorted(reason for _, _, reason in d.quarantined("by_profile")) == ["null key", "null key"]


def test_the_other_table_kinds_quarantine_null_keys_too(driven):
    """Table inner and outer, fk inner, list and derive keep their sides by key: a null-key record on
    either side is quarantined with its reason, never joined, never a row with a null key."""
    d = driven
    home = ("u1", {"page": "/home", "name": "Ann"}, 2000)
    assert d.changes("t_inner") == [home]
    assert d.changes("t_outer") == [home]  # the null-key profile is not an outer row of its own
    assert d.changes("by_profile_inner") == [home]
    elements = [{"id": "u1", "matched": True, "name": "Ann"}]
    assert d.changes("with_friends") == [("u1", {"page": "/home", "elements": elements}, 2000)]
    assert d.changes("by_name") == [("Ann", {"id": "u1"}, 1000)]  # the null-key profile derives nothing
    for name in ("t_inner", "t_outer", "by_profile_inner", "with_friends"):  # the event's and the profile's
        assert sorted(reason for _, _, reason in d.quarantined(name)) == ["null key", "null key"], name
    assert [reason for _, _, reason in d.quarantined("by_name")] == ["null key"]  # the profile's
    for name in ("t_inner", "t_outer", "by_profile_inner", "with_friends", "by_name"):
        assert d.queries[name].metrics.skipped == 0, name


FOREIGN = """
pipeline: null-foreign-keys
topics:
  events: {partitions: 2}
  profiles: {partitions: 2}
joins:
  by_profile_inner: {kind: fk, left: events, right: profiles, foreign_key: profile, type: inner, select: {page: left.page, name: right.name}}
  by_name: {kind: derive, left: profiles, key: name, select: {id: "cast(master_key as string)"}}
"""


def test_records_that_join_nothing_by_a_null_foreign_or_derived_key_are_quarantined(spark, tmp_path):
    """KIP-1328's dropped records: an inner fk join's event whose foreign key is null joins nothing
    (a left join keeps it, with null right columns: test_fk.py), and a profile without a name derives no key.
    Each is quarantined once, with its topic, offset and reason, and the batch counts its inputs once."""
    (tmp_path / "pipeline.yaml").write_text(FOREIGN)
    with PipelineTestDriver(tmp_path / "pipeline.yaml", root=tmp_path / "lake", spark=spark) as d:
        d.pipe("profiles", key="u1", value={"name": "Ann"}, timestamp=1000)
        d.pipe("profiles", key="u2", value={"city": "Oslo"}, timestamp=1000)  # no name
        d.pipe("events", key="e1", value={"page": "/home", "profile": "u1"}, timestamp=2000)
        d.pipe("events", key="e2", value={"page": "/anon"}, timestamp=2000)  # no profile
        d.advance()
        assert d.changes("by_profile_inner") == [("e1", {"page": "/home", "name": "Ann"}, 2000)]
        ((source, offset, reason),) = d.quarantined("by_profile_inner")
        assert source.startswith("events[") and reason == (
            "null foreign key: an inner join drops a record whose foreign key (profile) is null (key 'e2')"
        )
        m = d.queries["by_profile_inner"].metrics
        assert (m.input_left, m.input_right, m.quarantined, dict(m.dropped)) == (
            2,
            2,
            0,
            {"null_foreign_key": 1},
        )
        assert d.changes("by_name") == [("Ann", {"id": "u1"}, 1000)]
        assert [r for _, _, r in d.quarantined("by_name")] == [
            "null derived key: the record derives no key (name is null) (key 'u2')"
        ]
        assert dict(d.queries["by_name"].metrics.dropped) == {"null_derived_key": 1}
