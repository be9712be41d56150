"""The stream–stream join (docs/joins.md, "Semantics"), through its real streaming query. That its output is the
same for any split into micro-batches is test_join_properties.py's (random splits, and this file's
former fixed one as an explicit example)."""

from __future__ import annotations

import pytest
from joinkit import SECOND, T0, Feeder, assert_oracle, produce, result_rows, write_config


@pytest.fixture
def cfg(tmp_path):
    return write_config(tmp_path)


def test_stream_stream_pairs_within_the_window_and_emits_the_unmatched_when_it_closes(spark, lake, cfg):
    feeders = {n: Feeder(spark, lake, cfg, n) for n in ("ss_inner", "ss_left", "ss_outer")}
    produce(lake, cfg, "L", [("a", "l1", T0), ("a", "l2", T0 + 4 * SECOND), ("b", "lb", T0 + 5 * SECOND)])
    produce(
        lake,
        cfg,
        "R",
        [
            ("a", "r1", T0 + 10 * SECOND),  # within 10 s of l1 and l2
            ("a", "r2", T0 + 12 * SECOND),  # only within l2's window
            ("c", "rc", T0 + 13 * SECOND),
            ("z", "rz", T0 + 60 * SECOND),  # moves the watermark past every window above
        ],
    )
    outcomes = {name: (m.matched, m.unmatched) for name, m in ((n, f.feed()) for n, f in feeders.items())}
    assert outcomes == {"ss_inner": (3, 0), "ss_left": (3, 1), "ss_outer": (3, 2)}  # the metrics' rows
    pairs = [("a", "l1", "r1"), ("a", "l2", "r1"), ("a", "l2", "r2")]
    assert result_rows(lake, "ss_inner") == pairs
    assert result_rows(lake, "ss_left") == sorted([*pairs, ("b", "lb", None)])
    # rz's own window is still open: not emitted yet
    assert result_rows(lake, "ss_outer") == sorted([*pairs, ("b", "lb", None), ("c", None, "rc")])
    for name in feeders:
        assert_oracle(spark, lake, cfg, name)
