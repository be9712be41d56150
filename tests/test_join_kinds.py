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


def test_what_explain_asks_of_each_kind():
    """How ``lake explain`` finds a row's input records and why a side is empty, per kind."""
    facts = {
        name: (
            kind.provenance,
            kind.right_by_key,
            kind.by_foreign_key,
            kind.rekeyed,
            kind.left_may_be_missing,
        )
        for name, kind in KINDS.items()
    }
    sources = ("left_partition", "left_offset", "right_partition", "right_offset")
    assert facts == {
        "table": (sources, True, False, False, True),
        "stream-table": (
            ("partition", "offset", "right_partition", "right_offset"),
            True,
            False,
            False,
            False,
        ),
        "stream-stream": (sources, True, False, False, False),
        "fk": (sources, False, True, False, False),
        "list": (("left_partition", "left_offset", "element_sources"), False, False, False, False),
        "derive": (("left_partition", "left_offset"), False, False, True, False),
    }
    assert [n for n, k in KINDS.items() if k.right_as_of_event] == ["stream-table"]
    for kind in KINDS.values():  # provenance is part of what every result row carries
        assert set(kind.provenance) <= set(kind.meta_columns)


def test_no_kind_name_is_compared_outside_the_kind_registry():
    """A new kind is one module and an entry in ``join_kinds``: no other module asks "is this kind
    X?" (they ask the kind's facts)."""
    import re
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "spark_jobs"
    names = "|".join(re.escape(n) for n in KINDS)
    compared = re.compile(
        rf"""kind\s*(==|!=)\s*["']({names})["']|kind\s+(not\s+)?in\s*[\(\[{{][^)\]}}]*["']({names})["']"""
    )
    allowed = {package / "join_kinds.py", package / "joins" / "registry.py"}
    found = [
        f"{path.relative_to(package)}:{n}: {line.strip()}"
        for path in package.rglob("*.py")
        if path not in allowed
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if compared.search(line)
    ]
    assert found == []
