"""What fk, list and derive share: their key expressions checked up front, and the plain-Python
models agreeing with the engine on a mixed history."""

from __future__ import annotations

import pytest
from joinkit import (
    KEYED_PIPELINE,
    T0,
    Feeder,
    derive_rows,
    fk_rows,
    jv,
    list_rows,
    model_derive,
    model_fk,
    model_list,
    produce,
    topic_history,
    write_config,
)

from spark_jobs.errors import UserError
from spark_jobs.joins.registry import job_for
from spark_jobs.seams.delta import Lake


@pytest.fixture
def cfg(tmp_path):
    return write_config(tmp_path, KEYED_PIPELINE)


def test_bad_foreign_key_and_element_expressions_are_user_errors_with_their_line(spark, tmp_path):
    base = "topics:\n  P: {partitions: 1}\n  M: {partitions: 1}\njoins:\n  j:\n    kind: fk\n    left: P\n    right: M\n"
    (tmp_path / "a.yaml").write_text(base + "    foreign_key: nosuch(left.m)\n    select: {a: left.v}\n")
    from spark_jobs.config import load_config

    cfg = load_config(tmp_path / "a.yaml")
    with pytest.raises(UserError, match=r"a.yaml:9: joins.j.foreign_key: .*nosuch"):
        job_for(spark, Lake(tmp_path / "lake"), cfg, cfg.join("j"), "q")
    text = (
        "topics:\n  P: {partitions: 1}\n  M: {partitions: 1}\njoins:\n  j:\n    kind: list\n    left: P\n"
        "    right: M\n    list: ids\n    elements: {a: right.nope.deeper}\n"
    )
    (tmp_path / "b.yaml").write_text(text)
    cfg = load_config(tmp_path / "b.yaml")
    with pytest.raises(UserError, match=r"b.yaml:10: joins.j.elements.a: "):
        job_for(spark, Lake(tmp_path / "lake2"), cfg, cfg.join("j"), "q")


def test_models_agree_with_the_engine_on_a_mixed_history(spark, lake, cfg):
    names = ("fk_inner", "fk_left", "list_left", "list_inner", "derive")
    feeders = {n: Feeder(spark, lake, cfg, n) for n in names}
    produce(lake, cfg, "M", [("m1", jv(v="acme"), T0), ("m2", jv(v="bolt"), T0)])
    produce(lake, cfg, "P", [("p1", jv(v="mug", m="m1"), T0), ("p2", jv(v="pen", m="m3"), T0)])
    produce(lake, cfg, "A", [("a1", jv(v="oslo"), T0)])
    produce(lake, cfg, "PE", [("ann", jv(v="Ann", ids=["a1", "a2"]), T0)])
    for f in feeders.values():
        f.feed()
    p, m = topic_history(lake, "P"), topic_history(lake, "M")
    pe, a = topic_history(lake, "PE"), topic_history(lake, "A")
    assert fk_rows(lake, "fk_inner") == model_fk(p, m, "inner") == [("p1", "mug", "acme")]
    assert fk_rows(lake, "fk_left") == model_fk(p, m, "left")
    assert list_rows(lake, "list_left") == model_list(pe, a, "left")
    assert list_rows(lake, "list_inner") == model_list(pe, a, "inner")
    assert derive_rows(lake) == model_derive(m) == [("acme", "m1", None), ("bolt", "m2", None)]
