"""The join kinds' facts, which the config, the engine, the oracle and the driver ask instead of
comparing kind names."""

from spark_jobs.join_kinds import KINDS, referencing


def test_each_kinds_facts():
    facts = {
        name: (kind.types[0], kind.has_right, kind.keyed_by, kind.references, kind.has_list, kind.events)
        for name, kind in KINDS.items()
    }
    assert facts == {
        "table": ("inner", True, None, False, False, False),
        "stream-table": ("inner", True, None, False, False, True),
        "stream-stream": ("inner", True, None, False, False, True),
        "fk": ("inner", True, "foreign_key", True, False, False),
        "list": ("left", True, "list", True, True, False),
        "derive": ("inner", False, "key", False, False, False),
    }


def test_the_kind_behind_a_referencing_setting():
    assert referencing("foreign_key").name == "fk"
    assert referencing("list").name == "list"


def test_every_result_carries_its_key_and_events_carry_their_place():
    for kind in KINDS.values():
        assert kind.meta_columns[0] == "key"
        if kind.events:
            assert {"partition", "offset"} <= {c.rsplit("_", 1)[-1] for c in kind.meta_columns}
