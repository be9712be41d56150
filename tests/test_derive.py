"""The derive join, rule by rule (docs/joins.md, "Foreign-key, list and derive joins"), through its real streaming query."""

from __future__ import annotations

import pytest
from joinkit import (
    KEYED_PIPELINE,
    SECOND,
    T0,
    Feeder,
    assert_oracle,
    derive_rows,
    jv,
    model_derive,
    produce,
    topic_history,
    write_config,
)


@pytest.fixture
def cfg(tmp_path):
    return write_config(tmp_path, KEYED_PIPELINE)


def test_derive_follows_its_master_insert_update_delete(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "derive")
    produce(lake, cfg, "M", [("m1", jv(v="a@x", n=1), T0), ("m2", jv(v="b@x", n=2), T0)])
    f.feed()
    assert derive_rows(lake) == [("a@x", "m1", 1), ("b@x", "m2", 2)]
    produce(lake, cfg, "M", [("m1", jv(v="c@x", n=1), T0 + SECOND)])  # update: old row out, new in
    m = f.feed()
    assert (m.upserted, m.deleted) == (1, 1)
    assert derive_rows(lake) == [("b@x", "m2", 2), ("c@x", "m1", 1)]
    produce(lake, cfg, "M", [("m2", None, T0 + 2 * SECOND)])
    f.feed()
    assert derive_rows(lake) == [("c@x", "m1", 1)]
    assert_oracle(spark, lake, cfg, "derive")


def test_derive_never_deletes_a_row_a_newer_update_wrote(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "derive")
    produce(lake, cfg, "M", [("m1", jv(v="a@x", n=1), T0)])
    f.feed()
    # m2 takes a@x (newer) in the same batch in which m1 moves away from it
    produce(
        lake, cfg, "M", [("m2", jv(v="a@x", n=2), T0 + 2 * SECOND), ("m1", jv(v="z@x", n=1), T0 + SECOND)]
    )
    f.feed()
    assert derive_rows(lake) == [("a@x", "m2", 2), ("z@x", "m1", 1)]
    # and across batches: m3 takes z@x, then m1's older move away from z@x arrives late
    produce(lake, cfg, "M", [("m3", jv(v="z@x", n=3), T0 + 5 * SECOND)])
    f.feed()
    produce(lake, cfg, "M", [("m1", jv(v="y@x", n=1), T0 + 4 * SECOND)])
    f.feed()
    assert derive_rows(lake) == [("a@x", "m2", 2), ("y@x", "m1", 1), ("z@x", "m3", 3)]
    # two masters holding one value: the newest wins; when it leaves, the other one is the row again
    produce(lake, cfg, "M", [("m2", jv(v="y@x", n=2), T0 + 6 * SECOND)])
    f.feed()
    assert derive_rows(lake) == [("y@x", "m2", 2), ("z@x", "m3", 3)]
    produce(lake, cfg, "M", [("m2", None, T0 + 7 * SECOND)])
    f.feed()
    assert derive_rows(lake) == [("y@x", "m1", 1), ("z@x", "m3", 3)]
    assert derive_rows(lake) == model_derive(topic_history(lake, "M"))
    assert_oracle(spark, lake, cfg, "derive")
