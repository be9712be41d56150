"""The record formats (spark_jobs.formats) against the run's embedded Schema Registry: each codec's
records written and read back in Python and decoded by Spark on the executors, schema evolution,
and every way a record can fail to decode, named, never a row of nulls."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from spark_jobs.config import load_config
from spark_jobs.errors import UserError
from spark_jobs.formats import DecodeError, Formats, LogicalKeys, framing

CONSENT_V1 = {
    "type": "record",
    "name": "Consent",
    "fields": [
        {"name": "customerId", "type": "string"},
        {
            "name": "consents",
            "type": {"type": "record", "name": "C", "fields": [{"name": "retargeter1", "type": "boolean"}]},
        },
    ],
}
CONSENT_V2 = json.loads(json.dumps(CONSENT_V1))
CONSENT_V2["fields"][1]["type"]["fields"].append({"name": "retargeter2", "type": "boolean", "default": False})
PERSON = """syntax = "proto3";
package people;
message Person {
  string name = 1;
  repeated string address_ids = 2;
  optional int32 age = 3;
}
message Other { string x = 1; }
"""
ADDRESS = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "integer"}},
    "required": ["id", "city"],
}


@pytest.fixture
def formats(tmp_path, lake):
    (tmp_path / "consent.avsc").write_text(json.dumps(CONSENT_V1))
    (tmp_path / "person.proto").write_text(PERSON)
    (tmp_path / "address.json").write_text(json.dumps(ADDRESS))
    (tmp_path / "p.yaml").write_text(
        "topics:\n"
        "  consents: {partitions: 2, value: {format: avro, schema: consent.avsc}}\n"
        "  persons: {partitions: 2, value: {format: protobuf, schema: person.proto}}\n"
        "  addresses: {partitions: 2, value: {format: json_schema, schema: address.json}}\n"
        "  names: {partitions: 2, key: avro, value: string}\n"
    )
    return Formats(load_config(tmp_path / "p.yaml"), lake.root)


def decoded(spark, codec, records):
    """Spark's decoding of ``records``: [(value as a dict, problem)]."""
    frame = spark.createDataFrame([(r,) for r in records], "value binary")
    codec.learn(frame, "value")
    rows = frame.select(codec.column(F.col("value")).alias("v"), codec.problem(F.col("value")).alias("p"))
    return [(None if r.v is None else r.v.asDict(recursive=True), r.p) for r in rows.collect()]


def test_avro_records_written_with_two_versions_decode_into_the_latest(spark, formats, tmp_path):
    old = formats.writing("consents", "value", None)  # the topic's schema file: version 1
    v1 = old.encode({"customerId": "u1", "consents": {"retargeter1": True}})
    (tmp_path / "v2.avsc").write_text(json.dumps(CONSENT_V2))
    new = old.write_with((tmp_path / "v2.avsc").read_text())
    v2 = old.encode({"customerId": "u2", "consents": {"retargeter1": False, "retargeter2": True}})
    assert framing.split(v1)[0] != framing.split(v2)[0] == new
    reader = Formats(formats.config, formats.root).codec("consents", "value")  # a new job: reads v2
    want = [
        {"customerId": "u1", "consents": {"retargeter1": True, "retargeter2": False}},
        {"customerId": "u2", "consents": {"retargeter1": False, "retargeter2": True}},
    ]
    assert [reader.decode(v1), reader.decode(v2)] == want
    assert decoded(spark, reader, [v1, v2, None]) == [(want[0], None), (want[1], None), (None, None)]
    assert json.loads(reader.render(v1)) == want[0]


def test_avro_records_that_do_not_decode_say_why(spark, formats):
    codec = formats.writing("consents", "value", None)
    good = codec.encode({"customerId": "u1", "consents": {"retargeter1": True}})
    schema_id = framing.split(good)[0]
    other = formats.registry.register(
        formats.kafka_name("elsewhere") + "-value",
        "AVRO",
        '{"type": "enum", "name": "Elsewhere", "symbols": ["A"]}',
    )
    subject = formats.kafka_name("consents") + "-value"
    records = [
        b'{"customerId":"u1"}',  # a producer without the registry
        good[:3],
        good[:8],  # cut inside the record
        good + b"\x00\x00",
        framing.frame(987654, good[5:]),
        framing.frame(other, good[5:]),
    ]
    assert [p for _, p in decoded(spark, codec, records)] == [
        "no magic byte: the record starts with 0x7B (plain JSON, written without the registry), not 0x00 "
        "followed by a schema id",
        "truncated: 3 bytes, a framed record has at least 5",
        f"not an Avro record of schema id {schema_id} ({subject}): truncated",
        f"bytes left after the Avro record of schema id {schema_id} ({subject}): written with another schema?",
        f"unknown schema id 987654 (the Schema Registry at {formats.registry.url} has no such schema)",
        f"schema id {other} belongs to {formats.kafka_name('elsewhere')}-value, not to {subject}",
    ]
    with pytest.raises(DecodeError, match="no magic byte"):
        codec.decode(records[0])


def test_avro_values_that_do_not_fit_name_the_field(formats):
    codec = formats.writing("consents", "value", None)
    with pytest.raises(ValueError, match=r"field consents\.retargeter1 must be boolean, got \"yes\""):
        codec.encode({"customerId": "u1", "consents": {"retargeter1": "yes"}})
    with pytest.raises(ValueError, match="field customerId is missing"):
        codec.encode({"consents": {"retargeter1": True}})


def test_an_avro_string_key_is_its_text_so_it_equals_the_plain_key(spark, formats, tmp_path):
    (tmp_path / "key.avsc").write_text('"string"')
    codec = formats.writing("names", "key", tmp_path / "key.avsc")
    framed = codec.encode_text(b"user_1")
    assert framed[:1] == b"\x00" and framed != b"user_1" and codec.decode(framed) == "user_1"
    frame = spark.createDataFrame([(framed,)], "key binary")
    assert frame.select(codec.key_bytes(F.col("key"))).first()[0] == b"user_1"


def test_protobuf_messages_decode_and_foreign_indexes_are_named(spark, formats):
    codec = formats.writing("persons", "value", None)
    ann = codec.encode({"name": "Ann", "address_ids": ["a1", "a2"], "age": 40})
    bob = codec.encode({"name": "Bob"})
    assert ann[5:6] == b"\x00"  # message indexes [0]: the first message
    assert codec.decode(ann) == {"name": "Ann", "address_ids": ["a1", "a2"], "age": 40}
    other = ann[:5] + framing.message_indexes([1]) + ann[6:]
    assert decoded(spark, codec, [ann, bob, other, ann[:9]]) == [
        ({"name": "Ann", "address_ids": ["a1", "a2"], "age": 40}, None),
        ({"name": "Bob", "address_ids": [], "age": None}, None),  # age has presence: unset is null
        (None, "message indexes [1] name people.Other, not the topic's people.Person"),
        (None, f"not a Protobuf people.Person of schema id {framing.split(ann)[0]}: While parsing a protocol "
         "message, the input ended unexpectedly in the middle of a field.  This could mean either that the "
         "input has been truncated or that an embedded message misreported its own length."),
    ]  # fmt: skip
    with pytest.raises(ValueError, match='has no field named "nam"'):
        codec.encode({"nam": "x"})


def test_a_proto_schema_protoc_refuses_is_one_line(formats, tmp_path):
    (tmp_path / "bad.proto").write_text('syntax = "proto3";\nmessage P { strin name = 1; }\n')
    with pytest.raises(
        UserError, match=r"topics\.persons\.value: not a Protobuf schema protoc can read: schema\.proto:2"
    ):
        formats.writing("persons", "value", tmp_path / "bad.proto")


def test_json_schema_records_decode_typed_and_misfits_are_named(spark, formats):
    codec = formats.writing("addresses", "value", None)
    good = codec.encode({"id": "a1", "city": "Paris", "zip": 75001})
    schema_id = framing.split(good)[0]
    subject = formats.kafka_name("addresses") + "-value"
    with pytest.raises(ValueError, match="the record: 'city' is a required property"):
        codec.encode({"id": "a2"})
    assert decoded(spark, codec, [
        good,
        framing.frame(schema_id, b'{"id":"a2"}'),
        framing.frame(schema_id, b'{"id":"a3","city":"X","zip":"abc"}'),
        b'{"id":"a4"}',
    ]) == [
        ({"id": "a1", "city": "Paris", "zip": 75001}, None),
        (None, "required field city is missing"),
        (None, f"not JSON of the schema of {subject} (schema id {schema_id}): a field of another type, or not JSON"),
        (None, "no magic byte: the record starts with 0x7B (plain JSON, written without the registry), not 0x00 "
         "followed by a schema id"),
    ]  # fmt: skip


def test_a_subject_without_a_schema_and_a_subject_of_another_format_are_one_line(formats, tmp_path):
    with pytest.raises(
        UserError, match=r"topics\.names\.key: subject .*names-key has no schema in the Schema Registry"
    ):
        formats.codec("names", "key")
    formats.registry.register(formats.kafka_name("names") + "-key", "JSON", json.dumps(ADDRESS))
    with pytest.raises(UserError, match="holds a json_schema schema .* but the topic declares avro"):
        Formats(formats.config, formats.root).codec("names", "key")


def test_config_takes_a_format_with_its_subject_and_schema_file(tmp_path):
    (tmp_path / "s.avsc").write_text('"string"')
    (tmp_path / "p.yaml").write_text(
        "topics:\n  t: {partitions: 1, key: {format: avro, subject: ids-key}, value: {format: avro, schema: s.avsc}}\n"
    )
    spec = load_config(tmp_path / "p.yaml").topic("t")
    assert (spec.key_format, spec.subject_of("key", "pre.t"), spec.key_schema) == ("avro", "ids-key", None)
    assert (spec.value_format, spec.subject_of("value", "pre.t"), spec.value_schema) == (
        "avro",
        "pre.t-value",
        Path(tmp_path / "s.avsc").resolve(),
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{format: avro, schema: s.proto}", "a avro schema file ends in .avsc, got s.proto"),
        ("{format: json, subject: x}", "subject and schema are for the registry formats"),
        ("{format: avro, schema: missing.avsc}", "missing.avsc: no such file"),
        ("{format: xml}", "must be one of json, string, avro, protobuf, json_schema, got 'xml'"),
    ],
)
def test_bad_formats_in_the_pipeline_file_are_one_line(tmp_path, value, message):
    (tmp_path / "s.proto").write_text("")
    (tmp_path / "p.yaml").write_text(f"topics:\n  t: {{partitions: 1, value: {value}}}\n")
    with pytest.raises(UserError, match=message):
        load_config(tmp_path / "p.yaml")


def test_a_running_join_reads_a_writer_version_registered_after_it_planned(spark, tmp_path, lake):
    """One streaming query across two micro-batches: between them the producer registers a new
    version of the subject and writes with it; the executors ask the registry about the new id and
    read the record into the reader schema the job started with (its new field left out)."""
    from joinkit import Feeder, produce

    (tmp_path / "consent.avsc").write_text(json.dumps(CONSENT_V1))
    (tmp_path / "v2.avsc").write_text(json.dumps(CONSENT_V2))
    (tmp_path / "p.yaml").write_text(
        "topics:\n"
        "  consents: {partitions: 2, value: {format: avro, schema: consent.avsc}}\n"
        "  mails: {partitions: 2}\n"
        "joins:\n"
        "  t: {kind: table, left: consents, right: mails, type: left,\n"
        "      select: {r1: left.consents.retargeter1, mail: right.v}}\n"
    )
    config = load_config(tmp_path / "p.yaml")
    writer = Formats(config, lake.root).writing("consents", "value", None)
    produce(
        lake,
        config,
        "consents",
        [("u1", writer.encode({"customerId": "u1", "consents": {"retargeter1": True}}), 1)],
    )
    produce(lake, config, "mails", [("u1", "u1@x", 1), ("u2", "u2@x", 1)])
    feeder = Feeder(spark, lake, config, "t")  # plans with version 1 only
    assert feeder.feed().quarantined == 0
    writer.write_with((tmp_path / "v2.avsc").read_text())  # registered while the query runs
    v2 = writer.encode({"customerId": "u2", "consents": {"retargeter1": False, "retargeter2": True}})
    produce(lake, config, "consents", [("u2", v2, 2)])
    assert feeder.feed().quarantined == 0
    rows = sorted(lake.read_arrow("t").to_pylist(), key=lambda r: r["key"])
    assert [(r["key"], r["r1"], r["mail"]) for r in rows] == [(b"u1", True, "u1@x"), (b"u2", False, "u2@x")]


# --- the join semantics on Avro values, through the public test driver -------------------------
VALUE = {"type": "record", "name": "V", "fields": [{"name": "v", "type": "string"}]}
AVRO_JOINS = """\
topics:
  L: {partitions: 2, value: {format: avro, schema: v.avsc}}
  R: {partitions: 2, value: {format: avro, schema: v.avsc}}
joins:
  t_left: {kind: table, left: L, right: R, type: left, select: {lv: left.v, rv: right.v}}
  t_outer: {kind: table, left: L, right: R, type: outer, select: {lv: left.v, rv: right.v}}
"""
_events = st.lists(
    st.tuples(
        st.sampled_from(["L", "R"]),
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["x", "y", None]),  # None: a tombstone
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=10,
)


@settings(  # CI: the example below and one random history (make bench: LAKE_PROPERTY_EXAMPLES)
    max_examples=int(os.environ.get("LAKE_PROPERTY_EXAMPLES", "1")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@example(
    evs=[("L", "a", "x", 0), ("R", "a", "y", 1), ("L", "b", "x", 0), ("R", "a", None, 1), ("L", "a", "y", 0)],
    cuts=[2, 4],
)
@given(evs=_events, cuts=st.lists(st.integers(1, 9), max_size=2))
def test_table_joins_on_avro_values_equal_the_model_after_every_advance(spark, tmp_path_factory, evs, cuts):
    """The table join (left and outer) on Avro-framed values, records piped through the test driver
    (its in-process registry) in random micro-batches: after each one the result equals the plain
    Python model of Kafka Streams' table-table join over the records so far."""
    from joinkit import SECOND, T0, model_table

    from spark_jobs.testing import PipelineTestDriver

    folder = tmp_path_factory.mktemp("avro-prop")
    (folder / "v.avsc").write_text(json.dumps(VALUE))
    (folder / "p.yaml").write_text(AVRO_JOINS)
    bounds = sorted({c for c in cuts if 0 < c < len(evs)}) + [len(evs)]
    history: dict[str, list[dict]] = {"L": [], "R": []}  # what was piped, as the model reads it
    with PipelineTestDriver(folder / "p.yaml", root=folder / "lake", spark=spark) as d:
        ts, start = T0, 0
        for end in bounds:
            for topic, key, value, step in evs[start:end]:
                ts += step * SECOND
                d.pipe(topic, key=key, value=None if value is None else {"v": value}, timestamp=ts)
                body = None if value is None else json.dumps({"v": value}).encode()
                # a key's records keep their order in its one partition: the piping order stands in for
                # its offsets
                history[topic].append({"key": key.encode(), "value": body, "timestamp": ts, "offset": start})
                start += 1
            d.advance()
            for how in ("left", "outer"):
                want = model_table(history["L"], history["R"], how)
                got = sorted(
                    ((k, r["lv"], r["rv"]) for k, r in d.table(f"t_{how}").items()),
                    key=lambda t: tuple((x is None, x) for x in t),
                )
                assert got == want, how


def test_a_protobuf_changelog_of_a_list_join_round_trips_through_the_test_driver(spark, tmp_path):
    """publish: {format: protobuf}: the changelog's .proto derived from the list join's result (a
    nested message per element), its records written by the executors and read back."""
    from spark_jobs.testing import PipelineTestDriver

    (tmp_path / "person.proto").write_text(PERSON)
    (tmp_path / "p.yaml").write_text(
        "topics:\n"
        "  persons: {partitions: 2, value: {format: protobuf, schema: person.proto}}\n"
        "  addresses: {partitions: 2}\n"
        "joins:\n"
        "  people:\n"
        "    kind: list\n    left: persons\n    right: addresses\n    list: address_ids\n"
        "    select: {name: left.name, age: left.age}\n"
        "    elements: {street: right.street}\n"
        "    as: addresses\n"
        "    publish: {format: protobuf}\n"
    )
    with PipelineTestDriver(tmp_path / "p.yaml", root=tmp_path / "lake", spark=spark) as d:
        d.pipe(
            "persons", key="ann", value={"name": "Ann", "address_ids": ["a1", "a2"], "age": 40}, timestamp=1
        )
        d.pipe("addresses", key="a1", value={"street": "Storgata 1"}, timestamp=1)
        d.advance()
        [(key, value, timestamp)] = d.changelog("people")
    assert timestamp == 1
    assert key == "ann"
    assert (value["name"], value["age"]) == ("Ann", 40)
    assert [(e.get("street"), e["matched"]) for e in value["addresses"]] == [
        ("Storgata 1", True),
        (None, False),
    ]


def test_a_json_schema_topic_joins_and_a_json_schema_changelog_round_trips(spark, tmp_path):
    """A table join whose right side is a JSON Schema topic, publishing its changelog as JSON Schema:
    typed fields in the select (``right.zip`` a long), the changelog's schema derived and registered,
    its records read back (through the test driver's in-process registry)."""
    from spark_jobs.testing import PipelineTestDriver

    (tmp_path / "address.json").write_text(json.dumps(ADDRESS))
    (tmp_path / "p.yaml").write_text(
        "topics:\n"
        "  people: {partitions: 2}\n"
        "  addresses: {partitions: 2, value: {format: json_schema, schema: address.json}}\n"
        "joins:\n"
        "  located:\n"
        "    kind: table\n    left: people\n    right: addresses\n    type: left\n"
        "    select: {name: left.name, city: right.city, zip_plus_one: right.zip + 1}\n"
        "    publish: {format: json_schema}\n"
    )
    with PipelineTestDriver(tmp_path / "p.yaml", root=tmp_path / "lake", spark=spark) as d:
        d.pipe("people", key="a1", value={"name": "Ann"}, timestamp=1)
        d.pipe("people", key="a2", value={"name": "Bob"}, timestamp=1)
        d.pipe("addresses", key="a1", value={"id": "a1", "city": "Oslo", "zip": 150}, timestamp=1)
        d.advance()
        published = sorted(d.changelog("located"), key=lambda r: r[0])
        table = d.table("located")
    assert published == [
        ("a1", {"name": "Ann", "city": "Oslo", "zip_plus_one": 151}, 1),
        ("a2", {"name": "Bob", "city": None, "zip_plus_one": None}, 1),
    ]
    assert table == {k: v for k, v, _ in published}


PERSON_V2 = """syntax = "proto3";
package people;
// a message added before the topic's: Person's message indexes are [1] in this version
message Header { string source = 1; }
message Person {
  string name = 1;
  repeated string address_ids = 2;
  optional int32 age = 3;
  map<string, string> tags = 4;
  message Nick { string text = 1; }
  Nick nick = 5;
}
message Other { string x = 1; }
"""


def test_protobuf_message_indexes_are_resolved_in_the_writer_schema(spark, tmp_path, lake):
    """A writer version that adds a message before the topic's writes Person at message indexes [1].
    A join planned with version 1 (Person at [0]) meets it in its second micro-batch: the executor
    outlines the new version, finds Person at [1], and reads it with the reader's Person; a record
    whose indexes name the new Header is quarantined naming it. Python's decoder does the same."""
    from joinkit import Feeder, produce

    (tmp_path / "person.proto").write_text(PERSON)
    (tmp_path / "v2.proto").write_text(PERSON_V2)
    (tmp_path / "p.yaml").write_text(
        "topics:\n"
        "  persons: {partitions: 2, value: {format: protobuf, schema: person.proto, message: people.Person}}\n"
        "  mails: {partitions: 2}\n"
        "joins:\n"
        "  t: {kind: table, left: persons, right: mails, type: left, select: {name: left.name, mail: right.v}}\n"
    )
    config = load_config(tmp_path / "p.yaml")
    writer = Formats(config, lake.root).writing("persons", "value", None)
    produce(lake, config, "persons", [("u1", writer.encode({"name": "Ann"}), 1)])
    produce(lake, config, "mails", [("u1", "u1@x", 1), ("u2", "u2@x", 1), ("u3", "u3@x", 1)])
    reader = Formats(config, lake.root).codec("persons", "value")  # version 1, as the job plans
    feeder = Feeder(spark, lake, config, "t")
    assert feeder.feed().quarantined == 0
    v2 = writer.write_with(PERSON_V2)  # registered while the query runs
    bob = writer.encode({"name": "Bob", "tags": {"k": "v"}, "nick": {"text": "b"}})
    assert bob[5:].startswith(framing.message_indexes([1]))  # Person's indexes in version 2
    header = framing.frame(v2, b"\x0a\x03crm", framing.message_indexes([0]))  # a Header, not a Person
    produce(lake, config, "persons", [("u2", bob, 2), ("u3", header, 2)])
    assert feeder.feed().quarantined == 1
    rows = sorted(lake.read_arrow("t").to_pylist(), key=lambda r: r["key"])
    assert [(r["key"], r["name"], r["mail"]) for r in rows] == [
        (b"u1", "Ann", "u1@x"),
        (b"u2", "Bob", "u2@x"),
    ]
    (quarantined,) = lake.read_arrow("quarantine").to_pylist()
    assert quarantined["reason"].startswith(
        "message indexes [0] name people.Header, not the topic's people.Person"
    )
    assert reader.decode(bob) == {"name": "Bob", "address_ids": []}  # read as version 1 has it
    with pytest.raises(
        DecodeError, match=r"message indexes \[0\] name people.Header, not the topic's people.Person"
    ):
        reader.decode(header)


def test_the_executors_outline_of_a_proto_numbers_its_messages_as_protoc_does(spark):
    """The outline an executor reads a writer version it did not know with (no protoc there) against
    protoc's descriptors: nested messages, map entries, proto2 groups, comments and strings that look
    like declarations."""
    from spark_jobs.formats.protobuf import compile_proto

    texts = [
        PERSON,
        PERSON_V2,
        """syntax = "proto2";
package a.b;
/* message Fake { } */
message Outer {
  // message AlsoFake {
  optional string message = 1 [default = "message M {"];
  repeated group Item = 2 { optional int32 id = 3; }
  map<string, Outer> child_nodes = 4;
  message Inner { enum Kind { A = 0; } oneof o { string s = 5; } message Deep {} }
  extensions 100 to 200;
}
enum Top { T = 0; }
message Second { option deprecated = true; }
service S { rpc Call (Outer) returns (Second); }
""",
    ]
    for text in texts:
        protoc = {".".join(map(str, path)): name for path, name in compile_proto(text, "test").names.items()}
        outline = dict(spark._jvm.lake.formats.ProtobufOutline.of(text))
        assert outline == protoc, text


ORDER_KEY_V1 = {
    "type": "record",
    "name": "OrderKey",
    "fields": [
        {"name": "shop", "type": "string"},
        {"name": "number", "type": "long"},
        {"name": "line", "type": "int"},
        {"name": "express", "type": "boolean"},
        {"name": "region", "type": ["null", "string"], "default": None},
        {"name": "channel", "type": {"type": "enum", "name": "Channel", "symbols": ["WEB", "STORE"]}},
        {"name": "tag", "type": "bytes"},
        {"name": "weight", "type": "double"},
        {"name": "ratio", "type": "float"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "seller", "type": {"type": "record", "name": "Seller", "fields": [
            {"name": "id", "type": "string"}, {"name": "since", "type": ["null", "long"], "default": None}]}},
        {"name": "either", "type": ["null", "string", "long"], "default": None},
        {"name": "lines", "type": {"type": "array", "items": "int"}},
    ],
}  # fmt: skip
ORDER_KEY_V2 = json.loads(json.dumps(ORDER_KEY_V1))
ORDER_KEY_V2["fields"].append({"name": "source", "type": "string", "default": "legacy"})
ORDER_PROTO = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message OrderKey {
  enum Channel { WEB = 0; STORE = 1; }
  string shop = 1;
  int64 number = 2;
  int32 line = 3;
  uint32 batch = 4;
  bool express = 5;
  optional string region = 6;
  Channel channel = 7;
  bytes tag = 8;
  double weight = 9;
  float ratio = 10;
  google.protobuf.Timestamp at = 11;
  Seller seller = 12;
  repeated int64 lines = 13;
}
message Seller { string id = 1; int64 since = 2; }
"""
ORDER_JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "shop": {"type": "string"},
        "number": {"type": "integer"},
        "express": {"type": "boolean"},
        "weight": {"type": "number"},
        "region": {"type": ["string", "null"]},
        "seller": {"type": "object", "properties": {"id": {"type": "string"}, "since": {"type": "integer"}}},
        "lines": {"type": "array", "items": {"type": "integer"}},
        "note": {"type": "string"},
    },
}


def test_a_composite_key_has_one_logical_value_in_spark_and_in_python(spark, tmp_path, lake):
    """The logical key the joins compute in Spark (``key_bytes``), the one ``lake explain`` computes
    in Python (``logical``) and the one ``lake diagnose`` computes without a pipeline are one value, for composite keys of every
    registry format: nulls, defaults, a field only the reader schema has, 64-bit integers, floats,
    enums, bytes, decimals, dates, times, nested records, unions and lists."""
    (tmp_path / "v1.avsc").write_text(json.dumps(ORDER_KEY_V1))
    (tmp_path / "v2.avsc").write_text(json.dumps(ORDER_KEY_V2))
    (tmp_path / "order.proto").write_text(ORDER_PROTO)
    (tmp_path / "order.json").write_text(json.dumps(ORDER_JSON_SCHEMA))
    (tmp_path / "p.yaml").write_text(
        "topics:\n"
        "  avro_orders: {partitions: 1, key: {format: avro, schema: v1.avsc}, value: string}\n"
        "  proto_orders: {partitions: 1, key: {format: protobuf, schema: order.proto}, value: string}\n"
        "  json_orders: {partitions: 1, key: {format: json_schema, schema: order.json}, value: string}\n"
    )
    config = load_config(tmp_path / "p.yaml")
    writing = Formats(config, lake.root)
    big = 2**62 + 7  # beyond a double's integers: a number, not a string, in both
    avro = writing.writing("avro_orders", "key", None)
    avro_records = [
        avro.encode({"shop": "s\u00e9\t\x01", "number": big, "line": -3, "express": True, "region": None,
                     "channel": "STORE", "tag": b"\x00\xff", "weight": 1e10, "ratio": 0.1,
                     "price": (1250).to_bytes(2, "big"), "day": 20786,
                     "at": 1795921445678,
                     "seller": {"id": "m1", "since": None}, "either": big, "lines": [1, 2]}),
        avro.encode({"shop": "s2", "number": 0, "line": 0, "express": False, "region": "eu",
                     "channel": "WEB", "tag": b"", "weight": 0.001, "ratio": 3.25, "price": b"\x07",
                     "day": 0, "at": 0,
                     "seller": {"id": "m2", "since": 5}, "either": "x", "lines": []}),
    ]  # fmt: skip
    writing.writing("avro_orders", "key", tmp_path / "v2.avsc")  # the reader now has a defaulted field
    proto = writing.writing("proto_orders", "key", None)
    proto_records = [
        proto.encode({"shop": "p1", "number": str(big), "line": 7, "batch": 4000000000, "express": True,
                      "region": "eu", "channel": "STORE", "tag": "AP8=", "weight": 2.5e-5, "ratio": 1.5,
                      "at": "2026-11-29T03:04:05.678Z", "seller": {"id": "m1", "since": "-9"},
                      "lines": ["1", str(big)]}),
        proto.encode({"shop": "p2"}),  # defaults, an unset optional, an unset message
    ]  # fmt: skip
    json_codec = writing.writing("json_orders", "key", None)
    json_records = [
        json_codec.encode({"shop": "j1", "number": big, "express": False, "weight": 3, "region": None,
                           "seller": {"id": "m1"}, "lines": [3, 1], "note": "x\"y"}),
        json_codec.encode({"number": -1, "note": "\u00e9"}),
    ]  # fmt: skip
    reading = Formats(config, lake.root)  # a command started after the v2 registration
    for topic, records in (("avro_orders", avro_records), ("proto_orders", proto_records),
                           ("json_orders", json_records)):  # fmt: skip
        codec = reading.codec(topic, "key")
        frame = spark.createDataFrame([(r,) for r in records], "key binary")
        codec.learn(frame, "key")
        in_spark = [bytes(r[0]) for r in frame.select(codec.key_bytes(F.col("key"))).collect()]
        assert [codec.logical(r) for r in records] == in_spark, topic
        assert [LogicalKeys(reading.registry)(r) for r in records] == in_spark, topic  # lake diagnose's
    assert json.loads(in_spark[0]) == {
        "shop": "j1", "number": big, "express": False, "weight": 3.0, "seller": {"id": "m1"}, "lines": [3, 1],
        "note": 'x"y',
    }  # fmt: skip
    avro_codec = reading.codec("avro_orders", "key")
    assert avro_codec.logical(avro_records[1]) == (
        b'{"shop":"s2","number":0,"line":0,"express":false,"region":"eu","channel":"WEB","tag":"",'
        b'"weight":0.001,"ratio":3.25,"price":0.07,"day":"1970-01-01","at":"1970-01-01T00:00:00.000Z",'
        b'"seller":{"id":"m2","since":5},"either":{"member0":"x"},"lines":[],"source":"legacy"}'
    )
    assert reading.codec("proto_orders", "key").logical(proto_records[1]) == (
        b'{"shop":"p2","number":0,"line":0,"batch":0,"express":false,"channel":"WEB","tag":"",'
        b'"weight":0.0,"ratio":0.0,"lines":[]}'
    )
    assert avro_codec.logical(b"not framed") == b"not framed"  # as key_bytes: what does not decode is itself
