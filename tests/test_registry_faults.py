"""Schema Registry faults as outside tests met them, through the CLI on a fresh lake root: a backfill
that registers a newer schema, a registry that never answers, JSON Schema's null and absent fields, a
check against an unreachable registry, and what a running join holds during a registry outage."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from registrykit import ACCOUNT, PIPELINE, Running, Switch, account, committed, lake, pipeline_in, self_signed


@pytest.fixture
def where(tmp_path):
    return pipeline_in(tmp_path)


def test_a_backfill_that_registers_a_newer_schema_compares_and_writes_in_it(spark, tmp_path, where, capsys):
    """accounts holds ten records written with v1; the pipeline's schema file is now v2 (tier added
    with a default). A dump that changes only tier for two customers, mail and tier for four, and
    nothing for four: the comparison is made in v2, so six are changed and written, tier included."""
    v1 = tmp_path / "a.txt"
    v1.write_text("".join(f"u{n};{json.dumps(account(n))}\n" for n in range(10)))
    assert lake(capsys, where, "produce", "accounts", str(v1), "-K", ";")[0] == 0
    v2 = dict(ACCOUNT, fields=[*ACCOUNT["fields"], {"name": "tier", "type": "string", "default": "basic"}])
    (tmp_path / "account.avsc").write_text(json.dumps(v2))  # the pipeline's schema file, now v2

    def wanted(n: int) -> dict:
        if n < 2:  # only the new field changes
            return dict(account(n), tier="gold")
        if n < 6:  # the mail and the new field
            return dict(account(n), contactMailAddress=f"new{n}@example.com", tier="silver")
        return dict(account(n), tier="basic")  # what v1's records read as in v2: unchanged

    dump = tmp_path / "accounts.jsonl"
    dump.write_text("".join(json.dumps({"id": f"u{n}", "account": wanted(n)}) + "\n" for n in range(10)))
    code, out, err = lake(capsys, where, "backfill", "accounts", "--from", str(dump))
    assert code == 0, err
    assert (
        "10 lines read, 0 new keys, 6 changed, 4 unchanged, 0 superseded duplicates, 0 rejected; wrote 6"
        in out
    )
    code, out, _ = lake(capsys, where, "consume", "accounts", "-f", "%k %s\\n")
    latest: dict[str, dict] = {}
    for line in out.splitlines():
        key, value = line.split(" ", 1)
        latest[json.loads(key)] = json.loads(value)
    assert latest == {f"u{n}": wanted(n) for n in range(10)}
    code, out, _ = lake(capsys, where, "show", "lookup_accounts", "--json")
    assert code == 0 and {r["key"]: r["value"] for r in map(json.loads, out.splitlines())} == latest
    # the same dump again: all unchanged
    code, out, err = lake(capsys, where, "backfill", "accounts", "--from", str(dump))
    assert code == 0, err
    assert "0 new keys, 0 changed, 10 unchanged" in out and "wrote 0 records" in out


def test_a_registry_that_accepts_connections_and_never_answers_is_one_line_not_a_hang(tmp_path, where):
    """kafka.schema_registry.url names a socket that listens and never reads: lake produce ends with
    one line naming the URL and the wait (every request has a timeout by default), and sends
    nothing."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # connections complete in the kernel's backlog; nobody ever reads them
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    config = Path(where[3])
    config.write_text(PIPELINE.replace("topics:", f"kafka:\n  schema_registry:\n    url: {url}\ntopics:", 1))
    (tmp_path / "a.txt").write_text(f"u1;{json.dumps(account(1))}\n")
    try:
        done = subprocess.run(
            [
                str(Path(sys.executable).parent / "lake"),
                "produce",
                "accounts",
                str(tmp_path / "a.txt"),
                "-K",
                ";",
            ]
            + where,
            capture_output=True,
            text=True,
            timeout=120,  # a hang fails here instead of holding the run
        )
    finally:
        silent.close()
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.splitlines() == [
        f"lake: error: Schema Registry at {url} ({config}): cannot list its subjects: no answer within 5 s "
        "(3 attempts; kafka.schema_registry.timeout sets the wait)"
    ]


PERSON = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "nick": {"type": ["string", "null"]},  # required, may be null
        "mail": {"type": "string"},  # optional, never null
        "note": {"type": ["string", "null"]},  # optional, may be null
        "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    "required": ["id", "nick"],
}
PEOPLE = """\
topics:
  people: {partitions: 2, key: string, value: {format: json_schema, schema: person.json}}
  visits: {partitions: 2, key: string, value: json}
joins:
  people_visits:
    kind: table
    left: people
    right: visits
    type: left
    select: {nick: left.nick, mail: left.mail, note: left.note, city: left.address.city}
"""
RECORDS = {  # each person's record, and why it is not valid for PERSON (None: valid)
    "p1": ({"id": "p1", "nick": "A", "mail": "a@example.com"}, None),
    "p2": ({"id": "p2", "nick": None}, None),
    "p3": ({"id": "p3"}, "required field nick is missing"),
    "p4": ({"id": "p4", "nick": "D", "mail": None}, "field mail is null, which its schema does not allow"),
    "p5": ({"id": "p5", "nick": "E", "note": None}, None),
    "p6": ({"id": "p6", "nick": "F", "address": {"city": None}}, "field address.city is null, which its schema "
           "does not allow"),
    "p7": ({"id": "p7", "nick": "G", "address": {}}, "required field address.city is missing"),
    "p8": ({"id": "p8", "nick": "H", "address": None}, "field address is null, which its schema does not allow"),
    "p9": ({"id": "p9", "nick": "I", "address": {"city": "Oslo"}}, None),
}  # fmt: skip


def test_json_schema_null_and_absent_fields_are_judged_alike_by_the_producer_and_the_join(
    spark, tmp_path, capsys
):
    """Required or optional, nullable or not, absent or null: lake produce accepts exactly the records
    the join decodes, and the join quarantines exactly the ones lake produce refuses (written here
    by a producer that does not validate), each with the field that makes it invalid."""
    from confluent_kafka import Producer

    from spark_jobs.formats import framing

    (tmp_path / "person.json").write_text(json.dumps(PERSON))
    (tmp_path / "p.yaml").write_text(PEOPLE)
    where = ["--root", str(tmp_path / "lake"), "--config", str(tmp_path / "p.yaml")]
    refused = {}
    for key, (value, _) in RECORDS.items():
        (tmp_path / "one.txt").write_text(f"{key};{json.dumps(value)}\n")
        code, _, err = lake(capsys, where, "produce", "people", str(tmp_path / "one.txt"), "-K", ";")
        assert code in (0, 2), err
        if code == 2:
            refused[key] = err
    assert sorted(refused) == sorted(k for k, (_, why) in RECORDS.items() if why), refused
    assert all("does not fit the JSON Schema of" in err for err in refused.values()), refused
    schema_id = int(lake(capsys, where, "consume", "people", "-f", "%i\\n")[1].split()[0])
    producer = Producer(
        {"bootstrap.servers": os.environ["LAKE_KAFKA_BOOTSTRAP"], "partitioner": "murmur2_random"}
    )
    prefix = os.environ["LAKE_KAFKA_TOPIC_PREFIX"]
    for key in refused:  # as a producer that does not validate writes them
        body = json.dumps(RECORDS[key][0]).encode()
        producer.produce(f"{prefix}people", framing.frame(schema_id, body), key.encode())
    assert producer.flush(10) == 0
    del producer

    code, out, err = lake(capsys, where, "run", "people_visits", "--once")
    assert code == 0, err
    code, out, _ = lake(capsys, where, "show", "quarantine", "--json")
    quarantined = {r["reason"].rsplit(" (key '", 1)[1][:-2]: r["reason"].rsplit(" (key '", 1)[0]
                   for r in map(json.loads, out.splitlines())}  # fmt: skip
    assert quarantined == {k: why for k, (_, why) in RECORDS.items() if why}
    code, out, _ = lake(capsys, where, "show", "people_visits", "--json")
    rows = {r["key"]: (r["nick"], r["mail"], r["note"], r["city"]) for r in map(json.loads, out.splitlines())}
    assert rows == {
        "p1": ("A", "a@example.com", None, None),
        "p2": (None, None, None, None),
        "p5": ("E", None, None, None),
        "p9": ("I", None, None, "Oslo"),
    }


@pytest.mark.parametrize(
    "command",
    [
        ["check"],
        ["run", "events_with_mail", "--once"],
        ["backfill", "accounts", "--from", "DUMP"],
        ["explain", "events_with_mail", "u1"],
    ],
)
def test_an_unreachable_registry_is_one_line_before_spark_starts_or_kafka_is_read(
    tmp_path, where, capsys, command
):
    """Nothing listens at the registry's URL: the command's only line is the error naming it (no
    'starting Spark', no offsets read, no check started), exit 2, and nothing is written."""
    config = Path(where[3])
    (tmp_path / "suite.yaml").write_text(
        "suite: keys\nversion: 1\nchecks:\n  - key_format:\n      topics: [accounts]\n"
    )
    config.write_text(
        PIPELINE.replace("topics:", "kafka:\n  schema_registry:\n    url: http://127.0.0.1:9\ntopics:", 1)
        + f"quality:\n  suites:\n    keys: {tmp_path / 'suite.yaml'}\n"
    )
    (tmp_path / "accounts.jsonl").write_text(json.dumps({"id": "u1", "account": account(1)}) + "\n")
    args = [str(tmp_path / "accounts.jsonl") if a == "DUMP" else a for a in command]
    code, out, err = lake(capsys, where, *args)
    assert (code, out) == (2, ""), err
    (line,) = err.splitlines()
    assert line.startswith(
        f"lake: error: Schema Registry at http://127.0.0.1:9 ({config}): cannot list its subjects: "
    )
    assert not Path(where[1]).exists()  # nothing written under the lake root


def _behind(proxy: Switch, cert: Path, credentials: str) -> str:
    """PIPELINE naming the registry behind ``proxy``, trusting ``cert``, with ``credentials``."""
    return PIPELINE.replace(
        "topics:",
        f"kafka:\n  schema_registry:\n    url: {proxy.url}\n    ssl.ca.location: {cert}\n"
        f"    basic.auth.user.info: {credentials}\ntopics:",
        1,
    )


def _with_field(name: str, default: str, *more: dict) -> dict:
    return dict(
        ACCOUNT, fields=[*ACCOUNT["fields"], *more, {"name": name, "type": "string", "default": default}]
    )


@pytest.mark.slow
def test_executors_ask_a_registry_behind_tls_and_credentials_as_the_driver_does_and_stop_on_a_refusal(
    tmp_path, capsys
):
    """The registry is behind HTTPS with a self-signed certificate (ssl.ca.location) and basic
    credentials. A continuous join meets a schema version registered after it started: the executors
    ask the registry with the driver's TLS trust and credentials, and u2 joins. Then the registry
    refuses the credentials: the next new version stops the job with one line naming the URL and the
    status (a refusal is not an outage to wait out), and nothing is committed for u3."""
    cert, key = self_signed(tmp_path)
    proxy = Switch(os.environ["LAKE_SCHEMA_REGISTRY_URL"], tls=(cert, key), credentials="lake:s3cret")
    where = pipeline_in(tmp_path)
    config = Path(where[3])
    config.write_text(_behind(proxy, cert, "lake:s3cret"))
    direct = tmp_path / "direct.yaml"  # the producer of the refused step writes to the registry itself
    direct.write_text(PIPELINE)
    job = None

    def produce(topic: str, line: str, *extra: str, via: Path = config) -> None:
        (tmp_path / "line.txt").write_text(line + "\n")
        args = ["produce", topic, str(tmp_path / "line.txt"), "-K", ";", *extra]
        code, _, err = lake(capsys, ["--root", where[1], "--config", str(via)], *args)
        assert code == 0, err

    try:
        produce("events", 'u1;{"page":"home"}')
        produce("accounts", f"u1;{json.dumps(account(1))}")
        job = Running(where)
        mails, until, proc = job.mails, job.until, job.proc
        until(lambda: mails() == [(b"u1", "u1@example.com")], 180)
        (tmp_path / "v2.avsc").write_text(json.dumps(_with_field("tier", "basic")))
        produce(
            "accounts",
            f"u2;{json.dumps(dict(account(2), tier='gold'))}",
            "--value-schema",
            str(tmp_path / "v2.avsc"),
        )
        produce("events", 'u2;{"page":"cart"}')
        until(lambda: mails() == [(b"u1", "u1@example.com"), (b"u2", "u2@example.com")], 120)

        proxy.want("lake:rotated")  # the registry's credentials changed under the running job
        v3 = _with_field("region", "eu", {"name": "tier", "type": "string", "default": "basic"})
        (tmp_path / "v3.avsc").write_text(json.dumps(v3))
        produce(
            "accounts",
            f"u3;{json.dumps(account(3))}",
            "--value-schema",
            str(tmp_path / "v3.avsc"),
            via=direct,
        )
        produce("events", 'u3;{"page":"faq"}', via=direct)
        out, err = proc.communicate(timeout=180)
    finally:
        if job is not None:
            job.kill()
        proxy.off()
    assert proc.returncode == 2, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"lake: error: join events_with_mail: the Schema Registry at {re.escape(proxy.url)} refused the "
        r"executors' request for schema id \d+: HTTP 401 \(the credentials were refused\); it stopped: the "
        r"micro-batch was not committed, fix kafka.schema_registry's settings and start it again",
        last,
    ), last
    assert mails() == [(b"u1", "u1@example.com"), (b"u2", "u2@example.com")]  # no row for u3


def test_a_tls_failure_on_the_executors_is_a_refusal_not_an_outage(spark, tmp_path, lake):
    """The registry's certificate changes to one the settings do not trust: the executor that asks
    about a new schema id fails with a refusal naming TLS (which stops a job), not with 'did not
    answer' (which a job would wait out for ever)."""
    from py4j.protocol import Py4JJavaError
    from pyspark.sql import functions as F

    from spark_jobs.config import load_config
    from spark_jobs.formats import Formats, framing

    cert, key = self_signed(tmp_path)
    proxy = Switch(os.environ["LAKE_SCHEMA_REGISTRY_URL"], tls=(cert, key), credentials="lake:s3cret")
    try:
        (tmp_path / "account.avsc").write_text(json.dumps(ACCOUNT))
        (tmp_path / "key.avsc").write_text('"string"')
        (tmp_path / "p.yaml").write_text(_behind(proxy, cert, "lake:s3cret"))
        formats = Formats(load_config(tmp_path / "p.yaml"), lake.root)
        codec = formats.writing("accounts", "value", None)
        v2 = formats.registry.register(codec.subject, "AVRO", json.dumps(_with_field("tier", "basic")))
        proxy.off()
        proxy.tls = self_signed(tmp_path, "impostor")  # the same address, a certificate nobody trusts
        proxy.on()
        frame = spark.createDataFrame([(framing.frame(v2, b"\x04u9\x00"),)], "value binary")
        with pytest.raises(Py4JJavaError) as failed:
            frame.select(codec.problem(F.col("value"))).collect()
    finally:
        proxy.off()
    text = str(failed.value)
    assert (
        f"lake.formats.RegistryLookup$Refused: the Schema Registry at {proxy.url} refused the executors' "
        f"request for schema id {v2}: TLS: "
    ) in text
    assert "did not answer" not in text


def test_protobuf_changelog_fields_keep_their_numbers_when_a_column_is_inserted(
    spark, tmp_path, where, capsys
):
    """The Protobuf changelog's schema follows the select. A column inserted in the middle gets the
    next unused field number, so a reader with the old schema (confluent-kafka's deserializer) reads
    every field it knows into the right field, as the registry (which checks names and types, not
    positions) promises it."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf.json_format import MessageToDict

    from spark_jobs.formats.protobuf import compile_proto

    config = Path(where[3])
    published = PIPELINE.replace(
        "      mail: right.contactMailAddress\n",
        "      mail: right.contactMailAddress\n    publish: {format: protobuf}\n",
    )
    config.write_text(published)
    (tmp_path / "events.txt").write_text('u1;{"page":"home"}\n')
    (tmp_path / "accounts.txt").write_text(f"u1;{json.dumps(account(1))}\n")
    assert lake(capsys, where, "produce", "events", str(tmp_path / "events.txt"), "-K", ";")[0] == 0
    assert lake(capsys, where, "produce", "accounts", str(tmp_path / "accounts.txt"), "-K", ";")[0] == 0
    assert lake(capsys, where, "run", "events_with_mail", "--once")[0] == 0
    config.write_text(
        published.replace("      page: left.page\n", "      page: left.page\n      plen: length(left.page)\n")
    )  # plen between page and mail
    code, _, err = lake(capsys, where, "run", "events_with_mail", "--once", "--reset")
    assert code == 0, err

    topic = f"{os.environ['LAKE_KAFKA_TOPIC_PREFIX']}events_with_mail_changelog"
    registry = SchemaRegistryClient({"url": os.environ["LAKE_SCHEMA_REGISTRY_URL"]})
    texts = [registry.get_version(f"{topic}-value", v).schema.schema_str for v in (1, 2)]
    numbers = [
        {f.name: f.number for f in compile_proto(t, "test").file_proto.message_type[0].field} for t in texts
    ]
    assert numbers == [{"page": 1, "mail": 2}, {"page": 1, "plen": 3, "mail": 2}]
    (value,) = [v for _, v in committed(topic) if v is not None]  # written with version 2
    read = {}
    for version, text in enumerate(texts, 1):
        message_class = compile_proto(text, "test").message_class
        deserialize = ProtobufDeserializer(message_class, {"use.deprecated.format": False})
        message = deserialize(value, SerializationContext(topic, MessageField.VALUE))
        read[version] = MessageToDict(message, preserving_proto_field_name=True)
    assert read == {
        1: {"page": "home", "mail": "u1@example.com"},
        2: {"page": "home", "plen": 4, "mail": "u1@example.com"},
    }


def test_a_removed_protobuf_changelog_field_reserves_its_number_and_a_new_one_never_reuses_it():
    """The numbering the product derives against the registered version: nested messages too; a
    removed field's number is reserved, and a field added later (its own name back, too) takes a
    number never used before."""
    from pyspark.sql import types as T

    from spark_jobs.formats.protobuf import ProtobufCodec, compile_proto

    def derived_schema(value_type: T.StructType, topic: str, registered: str | None = None) -> str:
        return ProtobufCodec.derive_schema(value_type, topic, registered)

    def struct(*fields: tuple[str, object]) -> T.StructType:
        return T.StructType([T.StructField(name, kind) for name, kind in fields])

    address = struct(("city", T.StringType()))
    v1 = derived_schema(struct(("page", T.StringType()), ("mail", T.StringType()),
                                           ("address", address)), "t")  # fmt: skip
    v2 = derived_schema(
        struct(
            ("plen", T.IntegerType()), ("address", struct(("zip", T.StringType()), ("city", T.StringType())))
        ),
        "t",
        v1,
    )
    v3 = derived_schema(struct(("page", T.StringType()), ("plen", T.IntegerType())), "t", v2)

    def numbers(text: str) -> tuple[dict, dict, list]:
        message = compile_proto(text, "test").file_proto.message_type[0]
        nested = {n.name: {f.name: f.number for f in n.field} for n in message.nested_type}
        reserved = [n for r in message.reserved_range for n in range(r.start, r.end)]
        return {f.name: f.number for f in message.field}, nested, reserved

    assert numbers(v1) == ({"page": 1, "mail": 2, "address": 3}, {"Address": {"city": 1}}, [])
    assert numbers(v2) == ({"plen": 4, "address": 3}, {"Address": {"zip": 2, "city": 1}}, [1, 2])
    assert numbers(v3) == ({"page": 5, "plen": 4}, {}, [1, 2, 3])
