"""Schema Registry topics as a user meets them, through the CLI on a fresh lake root with the run's
embedded registry: a backfill into an Avro lookup topic, a schema change the registry refuses, a
registry that cannot be reached or refuses the credentials, the same key framed on one topic and
plain on the other, and v1 and v2 records of one topic joined."""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from registrykit import ACCOUNT, PIPELINE, Running, Switch, account, committed, lake, pipeline_in, publishing

from spark_jobs.cli import main
from spark_jobs.formats import framing
from spark_jobs.seams.delta import Lake


@pytest.fixture
def where(tmp_path):
    return pipeline_in(tmp_path)


def _produce_u2_with_v2(capsys, where, tmp_path) -> None:
    """u2's account written with version 2 of the schema (a field added with a default)."""
    v2 = dict(ACCOUNT, fields=[*ACCOUNT["fields"], {"name": "tier", "type": "string", "default": "basic"}])
    (tmp_path / "v2.avsc").write_text(json.dumps(v2))
    (tmp_path / "a.txt").write_text(f"u2;{json.dumps(dict(account(2), tier='gold'))}\n")
    args = [
        "produce",
        "accounts",
        str(tmp_path / "a.txt"),
        "-K",
        ";",
        "--value-schema",
        str(tmp_path / "v2.avsc"),
    ]
    code, _, err = lake(capsys, where, *args)
    assert code == 0, err


def test_a_backfill_into_an_avro_lookup_writes_framed_records_and_quarantines_what_does_not_fit(
    spark, tmp_path, where, capsys
):
    dump = tmp_path / "accounts.jsonl"
    lines = [{"id": f"u{n}", "account": account(n)} for n in (1, 2)]
    lines.append({"id": "u3", "account": {"customerId": "u3"}})  # no address: the schema has no default
    dump.write_text("".join(json.dumps(line) + "\n" for line in lines))

    code, out, err = lake(capsys, where, "backfill", "accounts", "--from", str(dump), "--max-rejects", "1")
    assert code == 0, err
    assert (
        "3 lines read, 2 new keys, 0 changed, 0 unchanged, 0 superseded duplicates, 1 rejected; wrote 2"
        in out
    )
    code, out, _ = lake(capsys, where, "show", "quarantine", "--json")
    rejected = [json.loads(line) for line in out.splitlines()]
    assert [(r["line"], r["reason"]) for r in rejected] == [
        (3, f"value does not fit the Avro schema of {os.environ['LAKE_KAFKA_TOPIC_PREFIX']}accounts-value: field "
         "contactMailAddress is missing (it has no default)")
    ]  # fmt: skip
    # as any consumer with the registry's deserializer reads them: framed, with the schema's ids
    code, out, _ = lake(capsys, where, "consume", "accounts", "-f", "%I %i %k %s\\n")
    records = sorted(line.split(" ", 3) for line in out.splitlines())
    assert [(k, json.loads(v)) for _, _, k, v in records] == [('"u1"', account(1)), ('"u2"', account(2))]
    assert all(key_id != "-" and value_id != "-" and key_id != value_id for key_id, value_id, _, _ in records)
    # the same dump again: compared by the decoded values, nothing to write
    code, out, err = lake(capsys, where, "backfill", "accounts", "--from", str(dump), "--max-rejects", "1")
    assert code == 0, err
    assert "0 new keys, 0 changed, 2 unchanged" in out and "wrote 0 records" in out


def test_a_schema_change_the_registry_refuses_is_one_line_and_nothing_is_sent(tmp_path, where, capsys):
    line = tmp_path / "a.txt"
    line.write_text(f"u1;{json.dumps(account(1))}\n")
    assert lake(capsys, where, "produce", "accounts", str(line), "-K", ";")[0] == 0
    incompatible = dict(ACCOUNT, fields=[{"name": "customerId", "type": "long"}])  # BACKWARD refuses it
    (tmp_path / "v2.avsc").write_text(json.dumps(incompatible))
    line.write_text('u2;{"customerId": 2}\n')
    code, out, err = lake(
        capsys,
        where,
        "produce",
        "accounts",
        str(line),
        "-K",
        ";",
        "--value-schema",
        str(tmp_path / "v2.avsc"),
    )
    assert code == 2 and out == ""
    assert (
        err.startswith("lake: error: the Schema Registry at http://127.0.0.1:")
        and "refused the AVRO schema for subject" in err
        and "accounts-value" in err
    )
    assert len(err.strip().splitlines()) == 1
    code, out, _ = lake(capsys, where, "consume", "accounts", "-f", "%k\\n")
    assert out.splitlines() == ['"u1"']


class _Guarded(BaseHTTPRequestHandler):
    """A registry behind a proxy that wants a user's basic credentials (what the product is told
    with kafka.schema_registry.basic.auth.user.info)."""

    def do_GET(self):  # noqa: N802 - the HTTP server's naming
        wanted = "Basic " + base64.b64encode(b"lake:s3cret").decode()
        if self.headers.get("Authorization") != wanted:
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error_code": 40101, "message": "Unauthorized"}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"[]")

    def log_message(self, *args):
        pass


def test_a_registry_that_cannot_be_reached_or_refuses_the_credentials_is_one_line(tmp_path, where, capsys):
    server = HTTPServer(("127.0.0.1", 0), _Guarded)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    guarded = f"http://127.0.0.1:{server.server_port}"
    line = tmp_path / "a.txt"
    line.write_text(f"u1;{json.dumps(account(1))}\n")
    config = Path(where[3])
    try:
        not_the_api = os.environ["LAKE_SCHEMA_REGISTRY_URL"].split("/apis/")[0]  # the server, not its API
        for registry, said in (
            ("http://127.0.0.1:9", "cannot list its subjects"),  # nothing listens there
            (not_the_api, "refused the request: HTTP 404"),
            (f"{guarded}\n    basic.auth.user.info: lake:wrong", "the credentials were refused (HTTP 401"),
        ):
            config.write_text(
                PIPELINE.replace("topics:", f"kafka:\n  schema_registry:\n    url: {registry}\ntopics:", 1)
            )
            code, out, err = lake(capsys, where, "produce", "accounts", str(line), "-K", ";")
            url = registry.split()[0]
            assert (code, out) == (2, "")
            assert err.startswith(f"lake: error: Schema Registry at {url} ({config}): ") and said in err, err
            assert len(err.strip().splitlines()) == 1
    finally:
        server.shutdown()
    code, out, _ = lake(capsys, where, "consume", "accounts", "--raw", "-f", "%k\\n")
    assert out == ""  # nothing was produced


def test_a_key_framed_on_one_topic_and_plain_on_the_other_joins_as_one_key(spark, tmp_path, where, capsys):
    """events has the plain key u1, accounts the Avro-framed "u1": other bytes (a Kafka Streams join
    of the two finds nothing), the same logical key (this product joins them)."""
    (tmp_path / "events.txt").write_text('u1;{"page":"home"}\nu2;{"page":"cart"}\n')
    (tmp_path / "accounts.txt").write_text(f"u1;{json.dumps(account(1))}\n")
    assert lake(capsys, where, "produce", "events", str(tmp_path / "events.txt"), "-K", ";")[0] == 0
    assert lake(capsys, where, "produce", "accounts", str(tmp_path / "accounts.txt"), "-K", ";")[0] == 0
    code, out, _ = lake(capsys, where, "consume", "accounts", "--raw", "-f", "%K\\n")
    assert out.splitlines() == ["8"]  # 5 bytes of frame, then Avro's string: its length (a byte) and "u1"
    code, out, err = lake(capsys, where, "run", "events_with_mail", "--once")
    assert code == 0, err
    rows = sorted(Lake(Path(where[1])).read_arrow("events_with_mail").to_pylist(), key=lambda r: r["key"])
    assert [(r["key"], r["page"], r["mail"]) for r in rows] == [
        (b"u1", "home", "u1@example.com"),
        (b"u2", "cart", None),
    ]
    code, out, err = lake(capsys, where, "audit", "events_with_mail")
    assert code == 0 and out.endswith(": identical\n"), out + err


def test_records_of_two_schema_versions_in_one_topic_are_both_joined(spark, tmp_path, where, capsys):
    (tmp_path / "events.txt").write_text('u1;{"page":"home"}\nu2;{"page":"cart"}\n')
    assert lake(capsys, where, "produce", "events", str(tmp_path / "events.txt"), "-K", ";")[0] == 0
    (tmp_path / "a.txt").write_text(f"u1;{json.dumps(account(1))}\n")
    assert lake(capsys, where, "produce", "accounts", str(tmp_path / "a.txt"), "-K", ";")[0] == 0
    code, _, err = lake(capsys, where, "run", "events_with_mail", "--once")
    assert code == 0, err
    _produce_u2_with_v2(capsys, where, tmp_path)
    code, out, _ = lake(capsys, where, "consume", "accounts", "-f", "%i %s\\n")
    ids = sorted({line.split(" ", 1)[0] for line in out.splitlines()})
    assert len(ids) == 2  # a v1 record and a v2 record
    code, out, err = lake(capsys, where, "run", "events_with_mail", "--once")
    assert code == 0, err
    rows = sorted(Lake(Path(where[1])).read_arrow("events_with_mail").to_pylist(), key=lambda r: r["key"])
    assert [(r["key"], r["mail"]) for r in rows] == [(b"u1", "u1@example.com"), (b"u2", "u2@example.com")]


SUITE = """\
suite: framing
version: 1
checks:
  - co_partitioning:
      topics: [events, accounts]
  - key_format:
      topics: [events, accounts]
  - framing:
      topics: [events, accounts]
"""


def test_the_checks_name_a_key_framed_on_one_topic_and_plain_on_the_other(spark, tmp_path, where, capsys):
    """events' keys are plain strings, accounts' are Avro-framed strings: the same customers, other
    bytes, so murmur2 places some in other partitions. co_partitioning compares the decoded keys and
    names each one's framing and partitions; the framing census finds the one plain JSON record a
    producer without the registry wrote to accounts, with its offset."""
    from spark_jobs.formats import framing
    from spark_jobs.seams.partitioners import partition_for

    config = Path(where[3])
    config.write_text(PIPELINE + f"quality:\n  suites:\n    framing: {tmp_path / 'suite.yaml'}\n")
    (tmp_path / "suite.yaml").write_text(SUITE)
    users = ["u1", "u2", "u3", "u4"]
    (tmp_path / "events.txt").write_text("".join(f'{u};{{"page":"home"}}\n' for u in users))
    (tmp_path / "accounts.txt").write_text("".join(f"{u};{json.dumps(account(int(u[1:])))}\n" for u in users))
    assert lake(capsys, where, "produce", "events", str(tmp_path / "events.txt"), "-K", ";")[0] == 0
    assert lake(capsys, where, "produce", "accounts", str(tmp_path / "accounts.txt"), "-K", ";")[0] == 0
    code, out, _ = lake(capsys, where, "consume", "accounts", "--raw", "-f", "%k\\n")
    framed = {
        framing.split(k.encode("latin-1"))[1][1:].decode(): k.encode("latin-1") for k in out.splitlines()
    }
    key_id = framing.split(next(iter(framed.values())))[0]
    # a producer without the registry writes one record to accounts
    plain = tmp_path / "plain.yaml"
    plain.write_text(
        PIPELINE.replace(
            "key: {format: avro, schema: key.avsc}, value: {format: avro, schema: account.avsc}",
            "key: string, value: json",
        )
    )
    (tmp_path / "u9.txt").write_text('u9;{"customerId":"u9"}\n')
    assert (
        main(
            [
                "produce",
                "accounts",
                str(tmp_path / "u9.txt"),
                "-K",
                ";",
                "--root",
                where[1],
                "--config",
                str(plain),
            ]
        )
        == 0
    )

    code, out, err = lake(capsys, where, "check")
    assert code == 1, out + err
    apart = []
    for u in users:
        plain_p, framed_p = partition_for(u.encode(), 4), partition_for(framed[u], 4)
        where_ = (
            f"different partitions: events={plain_p}, accounts={framed_p}; " if plain_p != framed_p else ""
        )
        apart.append(
            f"{u}: {where_}its bytes differ: events plain, accounts framed with schema id {key_id} (this product "
            "joins the decoded key, but a Kafka Streams or ksqlDB join of these topics sees two keys: write "
            "both topics' keys the same way, plain or framed with one key schema)"
        )
    assert any(partition_for(u.encode(), 4) != partition_for(framed[u], 4) for u in users)  # the classic miss
    assert f"FAILED: 4 misplaced keys: {'; '.join(apart)}." in out
    u9 = [line for line in out.splitlines() if "framing:" in line and "FAIL" in line]
    prefix = os.environ["LAKE_KAFKA_TOPIC_PREFIX"]
    assert len(u9) == 1 and "FAILED: 2 records framed otherwise than declared:" in u9[0], out
    assert "accounts: 1 key(s) plain (not framed): no magic byte" in u9[0]
    assert (
        "accounts: 1 value(s) plain (not framed): no magic byte: the record starts with 0x7B (plain JSON, written without the registry)"
        in u9[0]
    )
    assert f"accounts keys: 4 framed with {prefix}accounts-key" in u9[0] and "events values: 4 plain" in u9[0]
    # lake diagnose, on the topics as Kafka names them, decodes the framed keys with the registry
    code, out, err = lake(capsys, where, "diagnose", f"{prefix}events", f"{prefix}accounts")
    assert code == 1, err
    assert (
        "4 keys are framed by a Schema Registry on one topic and plain on the other: the same key, other "
        "bytes (a Kafka Streams or ksqlDB join of the two misses them):"
    ) in out
    for u in users:
        assert (
            f"  {u}: {prefix}accounts partition {partition_for(framed[u], 4)} (framed with schema id {key_id}), "
            f"{prefix}events partition {partition_for(u.encode(), 4)} (plain)"
        ) in out.splitlines(), out
    assert out.strip().endswith("NOT co-partitioned, keys NOT clean")


@pytest.mark.parametrize("fmt", ["avro", "json_schema", "protobuf"])
def test_a_changelog_is_registered_and_read_by_confluent_kafkas_own_deserializers(
    spark, tmp_path, where, capsys, fmt
):
    """publish: {format: avro | json_schema | protobuf}: the changelog's schema is derived from the
    select and registered under <changelog>-value; confluent-kafka's own deserializers (independent
    readers, with the registry; for Protobuf the registered .proto compiled by protoc) read every
    record back, tombstones as None."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.serialization import MessageField, SerializationContext

    config = Path(where[3])
    config.write_text(publishing(fmt))
    (tmp_path / "events.txt").write_text('u1;{"page":"home"}\nu2;{"page":"cart"}\n')
    (tmp_path / "accounts.txt").write_text(f"u1;{json.dumps(account(1))}\n")
    assert lake(capsys, where, "produce", "events", str(tmp_path / "events.txt"), "-K", ";")[0] == 0
    assert lake(capsys, where, "produce", "accounts", str(tmp_path / "accounts.txt"), "-K", ";")[0] == 0
    code, _, err = lake(capsys, where, "run", "events_with_mail", "--once")
    assert code == 0, err
    (tmp_path / "gone.txt").write_text("u2;\n")
    assert lake(capsys, where, "produce", "events", str(tmp_path / "gone.txt"), "-K", ";", "-Z")[0] == 0
    code, _, err = lake(capsys, where, "run", "events_with_mail", "--once")
    assert code == 0, err

    prefix = os.environ["LAKE_KAFKA_TOPIC_PREFIX"]
    topic = f"{prefix}events_with_mail_changelog"
    registry = SchemaRegistryClient({"url": os.environ["LAKE_SCHEMA_REGISTRY_URL"]})
    registered = registry.get_latest_version(f"{topic}-value").schema
    assert registered.schema_type == {"avro": "AVRO", "json_schema": "JSON", "protobuf": "PROTOBUF"}[fmt]
    deserialize = _deserializer(fmt, registry, registered.schema_str, tmp_path)
    context = SerializationContext(topic, MessageField.VALUE)
    records = [(key.decode(), deserialize(value, context)) for key, value in committed(topic)]
    no_mail = {"page": "cart"} if fmt == "protobuf" else {"page": "cart", "mail": None}  # proto: unset
    assert sorted(records, key=lambda r: (r[0], r[1] is None)) == [
        ("u1", {"page": "home", "mail": "u1@example.com"}),
        ("u2", no_mail),
        ("u2", None),  # the left delete's tombstone
    ]


def _deserializer(fmt: str, registry, schema: str, tmp_path: Path):
    """confluent-kafka's deserializer of ``fmt``, giving dicts (None for a tombstone)."""
    if fmt == "avro":
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        return AvroDeserializer(registry)
    if fmt == "json_schema":
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer

        return JSONDeserializer(None, schema_registry_client=registry)
    import importlib.util

    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from google.protobuf.json_format import MessageToDict
    from grpc_tools import protoc

    (tmp_path / "changelog.proto").write_text(schema)
    assert protoc.main(["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}", "changelog.proto"]) == 0
    spec = importlib.util.spec_from_file_location("changelog_pb2", tmp_path / "changelog_pb2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (message_type,) = [getattr(module, name) for name in module.DESCRIPTOR.message_types_by_name]
    # without the registry client: it would ask for the schema in Confluent's serialized form, which
    # Apicurio's compatible API does not give; the frame (id, message indexes) is read all the same
    read = ProtobufDeserializer(message_type, {"use.deprecated.format": False})

    def deserialize(value, context):
        message = read(value, context)
        return None if message is None else MessageToDict(message, preserving_proto_field_name=True)

    return deserialize


def test_a_select_change_the_registry_refuses_is_one_line_at_the_start_and_nothing_is_written(
    spark, tmp_path, where, capsys
):
    """The Avro changelog's schema follows the select: a column added is a change BACKWARD accepts
    (every derived field nullable, null by default); a column whose type changes is refused at the
    job's start, in one line naming the subject and the registry's reason, before anything is
    written."""
    config = Path(where[3])
    published = publishing("avro")
    config.write_text(published)
    (tmp_path / "events.txt").write_text('u1;{"page":"home"}\n')
    (tmp_path / "accounts.txt").write_text(f"u1;{json.dumps(account(1))}\n")
    assert lake(capsys, where, "produce", "events", str(tmp_path / "events.txt"), "-K", ";")[0] == 0
    assert lake(capsys, where, "produce", "accounts", str(tmp_path / "accounts.txt"), "-K", ";")[0] == 0
    code, _, err = lake(capsys, where, "run", "events_with_mail", "--once")
    assert code == 0, err
    config.write_text(
        published.replace("      page: left.page\n", "      page: left.page\n      plen: length(left.page)\n")
    )
    code, _, err = lake(capsys, where, "run", "events_with_mail", "--once", "--reset")
    assert code == 0, err  # the added column: version 2 of the subject
    config.write_text(published.replace("      page: left.page\n", "      page: length(left.page)\n"))
    before = Lake(Path(where[1])).version("events_with_mail")
    code, out, err = lake(capsys, where, "run", "events_with_mail", "--once")
    subject = f"{os.environ['LAKE_KAFKA_TOPIC_PREFIX']}events_with_mail_changelog-value"
    assert (code, out) == (2, ""), err
    assert f"refused the AVRO schema for subject {subject}: " in err and len(err.strip().splitlines()) <= 2, (
        err
    )
    assert Lake(Path(where[1])).version("events_with_mail") == before  # the result table as it was


def test_key_schema_drift_is_named_by_the_key_format_check(spark, tmp_path, where, capsys):
    """One customer's key written with two versions of the key schema: the same logical key, other
    bytes from one record to the next. key_format names the key and both schema ids."""
    config = Path(where[3])
    (tmp_path / "suite.yaml").write_text(
        "suite: drift\nversion: 1\nchecks:\n  - key_format:\n      topics: [accounts]\n"
    )
    config.write_text(PIPELINE + f"quality:\n  suites:\n    drift: {tmp_path / 'suite.yaml'}\n")
    (tmp_path / "a.txt").write_text(f"u1;{json.dumps(account(1))}\nu2;{json.dumps(account(2))}\n")
    assert lake(capsys, where, "produce", "accounts", str(tmp_path / "a.txt"), "-K", ";")[0] == 0
    (tmp_path / "key2.avsc").write_text('{"type": "string", "doc": "the customer id, now documented"}')
    (tmp_path / "b.txt").write_text(f"u1;{json.dumps(account(1))}\n")
    code, _, err = lake(
        capsys,
        where,
        "produce",
        "accounts",
        str(tmp_path / "b.txt"),
        "-K",
        ";",
        "--key-schema",
        str(tmp_path / "key2.avsc"),
    )
    assert code == 0, err
    code, out, _ = lake(capsys, where, "consume", "accounts", "-f", "%k %I\\n")
    ids = sorted({line.split()[1] for line in out.splitlines() if line.startswith('"u1"')}, key=int)
    assert len(ids) == 2
    code, out, err = lake(capsys, where, "check")
    assert code == 1, out + err
    assert (
        f"FAILED: 1 badly formatted key: accounts: u1 written with schema ids {ids[0]} and {ids[1]}: one key, "
        "other bytes from one record to the next (a Kafka Streams join and the producers' partitioners see "
        "other keys)."
    ) in out, out


@pytest.mark.slow
def test_a_registry_outage_under_a_running_join_fails_the_batch_uncommitted_and_the_job_retries(
    spark, tmp_path, where, capsys, monkeypatch
):
    """While the registry is down, a batch of records of versions the job knows goes on (u3); then the
    job meets a schema id it has not seen: that micro-batch fails without being committed (no row with
    a null mail for u2, whose plain event waits with it), lake status says the job waits for the
    registry, and when the registry answers again the job's retry joins u2 with its mail."""
    real = os.environ["LAKE_SCHEMA_REGISTRY_URL"]
    switch = Switch(real)
    monkeypatch.setenv("LAKE_SCHEMA_REGISTRY_URL", switch.url)
    job = None
    try:
        (tmp_path / "events.txt").write_text('u1;{"page":"home"}\n')
        (tmp_path / "a.txt").write_text(f"u1;{json.dumps(account(1))}\n")
        assert lake(capsys, where, "produce", "events", str(tmp_path / "events.txt"), "-K", ";")[0] == 0
        assert lake(capsys, where, "produce", "accounts", str(tmp_path / "a.txt"), "-K", ";")[0] == 0
        job = Running(where)
        mails, until, proc = job.mails, job.until, job.proc
        until(lambda: mails() == [(b"u1", "u1@example.com")], 180)
        switch.off()
        # records of the version the job knows need no registry: u3's batch goes on during the outage
        (tmp_path / "a.txt").write_text(f"u3;{json.dumps(account(3))}\n")
        (tmp_path / "events.txt").write_text('u3;{"page":"faq"}\n')
        with monkeypatch.context() as direct:  # the producer writes through the registry itself
            direct.setenv("LAKE_SCHEMA_REGISTRY_URL", real)
            assert lake(capsys, where, "produce", "accounts", str(tmp_path / "a.txt"), "-K", ";")[0] == 0
        assert lake(capsys, where, "produce", "events", str(tmp_path / "events.txt"), "-K", ";")[0] == 0
        until(lambda: mails() == [(b"u1", "u1@example.com"), (b"u3", "u3@example.com")], 120)
        # a version it has not seen holds its whole batch, u2's plain event with it
        (tmp_path / "events.txt").write_text('u2;{"page":"cart"}\n')
        with monkeypatch.context() as direct:
            direct.setenv("LAKE_SCHEMA_REGISTRY_URL", real)
            _produce_u2_with_v2(capsys, where, tmp_path)
        assert lake(capsys, where, "produce", "events", str(tmp_path / "events.txt"), "-K", ";")[0] == 0

        until(lambda: "the micro-batch was not committed; retrying in" in _status(capsys, where), 120)
        said = _status(capsys, where)
        assert f"the Schema Registry at {switch.url} did not answer for schema id " in said, said
        assert mails() == [(b"u1", "u1@example.com"), (b"u3", "u3@example.com")]  # u2's batch waits
        switch.on()
        until(
            lambda: (
                mails() == [(b"u1", "u1@example.com"), (b"u2", "u2@example.com"), (b"u3", "u3@example.com")]
            ),
            120,
        )
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
        assert (
            f"join events_with_mail: the Schema Registry at {switch.url} did not answer for schema id" in err
        )
        assert "join events_with_mail: stopped on request after" in out
    finally:
        if job is not None:
            job.kill()
        switch.off()


def _status(capsys, where) -> str:
    return lake(capsys, where, "status")[1]


def test_records_of_an_avro_topic_that_do_not_decode_are_quarantined_with_offset_and_reason(
    spark, tmp_path, where, capsys
):
    """accounts declares Avro values; a producer without the registry wrote plain JSON, another an id
    the registry does not know, another a record cut short. The join quarantines each with its topic,
    partition, offset and the reason, counts them, joins the good record, and goes on: no row of
    nulls stands for a record it could not read."""
    from confluent_kafka import Producer

    config = Path(where[3])
    config.write_text(PIPELINE.replace("key: {format: avro, schema: key.avsc}", "key: string"))
    (tmp_path / "a.txt").write_text(f"u1;{json.dumps(account(1))}\n")
    assert lake(capsys, where, "produce", "accounts", str(tmp_path / "a.txt"), "-K", ";")[0] == 0
    prefix = os.environ["LAKE_KAFKA_TOPIC_PREFIX"]
    producer = Producer(
        {"bootstrap.servers": os.environ["LAKE_KAFKA_BOOTSTRAP"], "partitioner": "murmur2_random"}
    )
    registry_id = _value_id(capsys, where)
    record = _avro(account(4))
    for key, value in (
        ("u2", json.dumps(account(2)).encode()),  # no magic byte
        ("u3", framing.frame(987654, record)),  # an id the registry does not have
        ("u4", framing.frame(registry_id, record)[:8]),  # cut short
    ):
        producer.produce(f"{prefix}accounts", value, key.encode())
    assert producer.flush(10) == 0
    del producer  # closed before the run's broker stops
    (tmp_path / "events.txt").write_text("".join(f'u{n};{{"page":"p{n}"}}\n' for n in range(1, 5)))
    assert lake(capsys, where, "produce", "events", str(tmp_path / "events.txt"), "-K", ";")[0] == 0
    code, out, err = lake(capsys, where, "run", "events_with_mail", "--once")
    assert code == 0, err
    assert "8 input records, 4 upserted, 0 deleted, 0 appended, 3 quarantined" in out, out
    code, out, _ = lake(capsys, where, "consume", "accounts", "--raw", "-f", "%k %p %o\\n")
    where_is = {k: (int(p), int(o)) for k, p, o in (line.split() for line in out.splitlines())}
    code, out, _ = lake(capsys, where, "show", "quarantine", "--json")
    rows = sorted((r["source"], r["line"], r["reason"]) for r in map(json.loads, out.splitlines()))
    url, subject = os.environ["LAKE_SCHEMA_REGISTRY_URL"], f"{prefix}accounts-value"
    assert rows == sorted(
        [
            (f"accounts[{where_is['u2'][0]}]", where_is["u2"][1], "no magic byte: the record starts with 0x7B "
             "(plain JSON, written without the registry), not 0x00 followed by a schema id (key 'u2')"),
            (f"accounts[{where_is['u3'][0]}]", where_is["u3"][1], f"unknown schema id 987654 (the Schema "
             f"Registry at {url} has no such schema) (key 'u3')"),
            (f"accounts[{where_is['u4'][0]}]", where_is["u4"][1], f"not an Avro record of schema id "
             f"{registry_id} ({subject}): truncated (key 'u4')"),
        ]
    )  # fmt: skip
    result = Lake(Path(where[1])).read_arrow("events_with_mail").to_pylist()
    assert sorted((r["key"], r["page"], r["mail"]) for r in result) == [
        (b"u1", "p1", "u1@example.com"),
        (b"u2", "p2", None),  # the left join's row: accounts has no readable record for u2
        (b"u3", "p3", None),
        (b"u4", "p4", None),
    ]


def _value_id(capsys, where) -> int:
    code, out, _ = lake(capsys, where, "consume", "accounts", "-f", "%i\\n")
    return int(out.split()[0])


def _avro(value: dict) -> bytes:
    """``value`` as Avro's binary encoding of ACCOUNT (two strings), with no frame."""

    def text(s: str) -> bytes:
        data = s.encode()
        n = len(data) << 1  # zigzag of a non-negative length
        out = bytearray()
        while n > 0x7F:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
        return bytes(out) + data

    return text(value["customerId"]) + text(value["contactMailAddress"])
