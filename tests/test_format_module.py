"""A new record format is one module: a codec class, listed once in ``spark_jobs.formats``. This test
adds ``kv`` (a value written as ``name=Ann;city_id=c1``) the way a developer would, in the module
below and nowhere else, and runs it as users do: ``lake produce`` (a line that does not fit is one
line naming it), ``lake consume`` (records shown decoded), an fk join through the public test driver
(its foreign key a field of the kv value) and a quality check (a record a producer without the
format wrote is found, with its key and why)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql import Column
from pyspark.sql import functions as F

import spark_jobs.formats as formats_module
from spark_jobs.cli import main
from spark_jobs.formats.codec import Codec, DecodeError, as_json
from spark_jobs.testing import PipelineTestDriver

PAIRS = r"^[^=;]+=[^;]*(;[^=;]+=[^;]*)*$"


class KvCodec(Codec):
    """``kv``: a value is ``field=text`` pairs separated by ``;``; in Spark a map of its fields."""

    name = "kv"
    parts = ("value",)
    textual = True

    def encode_text(self, text: bytes) -> bytes:
        pairs = text.decode("utf-8", "replace").split(";")
        bad = next((p for p in pairs if "=" not in p), None)
        if bad is not None:
            raise ValueError(f"is not field=text pairs ({bad!r} has no '=')")
        return text

    def encode_given(self, value: Any) -> bytes | None:
        if isinstance(value, dict):
            return ";".join(f"{k}={v}" for k, v in value.items()).encode()
        return super().encode_given(value)

    def decode(self, raw: bytes) -> Any:
        try:
            return dict(pair.split("=", 1) for pair in raw.decode().split(";"))
        except (ValueError, UnicodeDecodeError):
            raise DecodeError("not field=text pairs") from None

    def render(self, raw: bytes) -> bytes:
        return as_json(self.decode(raw))

    def column(self, raw: Column) -> Column:
        return F.when(self.problem(raw).isNull(), F.str_to_map(raw.cast("string"), F.lit(";"), F.lit("=")))

    def problem(self, raw: Column) -> Column:
        return F.when(
            raw.isNotNull() & ~raw.cast("string").rlike(PAIRS), F.lit("value is not field=text pairs")
        )

    def field(self, path: str) -> Column:
        return F.col("left").getItem(path)


PIPELINE = """\
pipeline: kv_people
topics:
  people: {partitions: 2, value: kv}
  cities: {partitions: 2}
lookups:
  cities:
    topic: cities
    joined_with: [people]
  people:
    topic: people
    joined_with: []
quality:
  suites:
    people: SUITE
joins:
  people_with_country:
    kind: fk
    left: people
    right: cities
    foreign_key: city_id
    type: left
    select:
      name: left.name
      country: right.country
"""
SUITE = """\
suite: people
version: 1
checks:
  - lookup_basics:
      lookup: people
"""


@pytest.fixture
def with_kv(monkeypatch):
    codecs = formats_module._codecs
    monkeypatch.setattr(formats_module, "_codecs", lambda: [*codecs(), KvCodec])


def lake(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_format_added_in_one_module_is_produced_consumed_joined_and_checked(
    spark, tmp_path, capsys, with_kv
):
    (tmp_path / "suite.yaml").write_text(SUITE)
    (tmp_path / "p.yaml").write_text(PIPELINE.replace("SUITE", str(tmp_path / "suite.yaml")))
    where = ["--root", str(tmp_path / "lake"), "--config", str(tmp_path / "p.yaml")]

    # lake produce: a line that does not fit the format is one line naming it, and nothing is sent
    (tmp_path / "bad.txt").write_text("p1|name=Ann;city_id=c1\np2|name Bob\n")
    code, _, err = lake(capsys, *where, "produce", "people", str(tmp_path / "bad.txt"), "-K", "|")
    assert (code, err.strip()) == (
        2,
        f"lake: error: {tmp_path / 'bad.txt'}:2: value is not field=text pairs ('name Bob' has no '='): "
        "'name Bob'; topic 'people' declares kv values, nothing was sent",
    )
    (tmp_path / "people.txt").write_text("p1|name=Ann;city_id=c1\np2|name=Bob;city_id=c9\n")
    assert lake(capsys, *where, "produce", "people", str(tmp_path / "people.txt"), "-K", "|")[0] == 0

    # lake consume: each record decoded by the format's codec
    code, out, _ = lake(capsys, *where, "consume", "people", "-f", "%k %s\\n")
    assert code == 0
    assert sorted(out.splitlines()) == [
        'p1 {"name":"Ann","city_id":"c1"}',
        'p2 {"name":"Bob","city_id":"c9"}',
    ]

    # a quality check: a record written without the format (a producer of plain text) is found
    plain = tmp_path / "plain.yaml"
    plain.write_text(PIPELINE.replace("value: kv", "value: string").replace("SUITE", "suite.yaml"))
    (tmp_path / "p3.txt").write_text("p3|Cy from Bergen\n")
    assert main(["--root", str(tmp_path / "lake"), "--config", str(plain), "produce", "people",
                 str(tmp_path / "p3.txt"), "-K", "|"]) == 0  # fmt: skip
    code, out, _ = lake(capsys, *where, "check", "people", "--json", "--report-dir", str(tmp_path / "r"))
    assert code == 1
    (result,) = json.loads(out)["results"]
    assert (result["check"], result["success"]) == ("lookup_basics:people", False)
    assert [(f["key"], f["problem"]) for f in result["findings"]] == [("p3", "value is not field=text pairs")]

    # an fk join through the public test driver: the foreign key is a field of the kv value
    with PipelineTestDriver(tmp_path / "p.yaml", root=tmp_path / "driver", spark=spark) as d:
        d.pipe("cities", key="c1", value={"country": "NO"}, timestamp=1000)
        d.pipe("people", key="p1", value={"name": "Ann", "city_id": "c1"}, timestamp=2000)
        d.pipe("people", key="p2", value={"name": "Bob", "city_id": "c9"}, timestamp=3000)
        d.pipe("people", key="p4", value="not pairs", timestamp=4000)
        d.advance()
        assert sorted(d.changes("people_with_country")) == [
            ("p1", {"name": "Ann", "country": "NO"}, 2000),
            ("p2", {"name": "Bob", "country": None}, 3000),
        ]
        assert [reason for _, _, reason in d.quarantined("people_with_country")] == [
            "value is not field=text pairs (key 'p4')"
        ]


def test_no_format_name_is_compared_outside_the_formats():
    """A new format is one module: no module outside ``spark_jobs/formats`` asks "is this format X?"
    or keeps a table by format name (they ask the codec). The one name compared elsewhere is a
    backfill dump's own setting (``value_format: json``: its value text is JSON), not a topic's."""
    import re
    from pathlib import Path

    from spark_jobs.formats import format_names

    package = Path(__file__).resolve().parents[1] / "spark_jobs"
    names = "|".join(re.escape(n) for n in format_names())
    quoted = rf"""["']({names})["']"""
    compared = re.compile(
        rf"""(==|!=)\s*{quoted}|{quoted}\s*(==|!=)|\bin\s*[\(\[{{][^)\]}}]*{quoted}|[{{,]\s*{quoted}\s*:"""
        rf"""|[\(\[]\s*{quoted}\s*,\s*{quoted}"""  # a list of formats
    )
    allowed = {  # a backfill dump's value text: a dump's own vocabulary
        ("config.py", 'DUMP_VALUES = ("string", "json")'),
        ("config.py", 'return self.value_format == "json"'),
    }
    found = [
        f"{path.relative_to(package)}:{n}: {line.strip()}"
        for path in package.rglob("*.py")
        if package / "formats" not in path.parents
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if compared.search(line) and (str(path.relative_to(package)), line.strip()) not in allowed
    ]
    assert found == []
