"""The ``lake`` command as a user runs it: demo placement, config errors, one-line failures."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pyarrow as pa
import pytest

import spark_jobs.demo as demo_pipelines
from spark_jobs.cli import main
from spark_jobs.demo.data import demo_dump_path
from spark_jobs.seams.processes import free_port

# Java-client (murmur2) placement of the demo keys over 4 partitions. Independent of this repo's code
# only through the partitioner vectors in test_partitioners.py, which pin murmur2 to Kafka's.
JAVA_PLACEMENT = {
    "user_1": 3, "user_2": 2, "user_3": 2, "user_4": 2, "user_5": 1,
    "user_6": 1, "user_7": 2, "user_8": 0, "user_9": 2, "user_10": 1,
}  # fmt: skip


def lake_cli(root, *args, stdin: bytes | None = None):
    """Run ``lake`` in a subprocess (as a user would); returns (exit code, stdout, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "spark_jobs.cli", "--root", str(root), *args],
        input=stdin,
        capture_output=True,
    )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def test_demo_writes_once_and_consume_shows_java_placement(tmp_path):
    root = tmp_path / "lake"
    code, out, _ = lake_cli(root, "demo", "--topics-only")
    assert code == 0
    prefix = os.environ["LAKE_KAFKA_TOPIC_PREFIX"]
    assert "== 1. topics on Kafka (written with murmur2_random, the Java client's placement)" in out
    assert (
        f"customer_consents: produced 10 records to Kafka topic {prefix}customer_consents [p0=1, p1=3, p2=5, p3=1]"
        in out
    )
    assert (
        f"customer_accounts: produced 8 records to Kafka topic {prefix}customer_accounts [p0=1, p1=2, p2=4, p3=1]"
        in out
    )
    assert "starting Spark" not in out
    code, out, _ = lake_cli(root, "demo", "--topics-only")  # a second run leaves the topics alone
    assert "customer_consents: already has records, left as it is" in out
    code, out, err = lake_cli(root, "consume", "customer_consents", "-f", "%k,%p\\n")
    assert code == 0, err
    assert dict(line.split(",") for line in out.splitlines()) == {
        k: str(p) for k, p in JAVA_PLACEMENT.items()
    }
    code, out, _ = lake_cli(root, "consume", "customer_accounts", "-f", "%k\\n")
    assert sorted(out.split()) == sorted(f"user_{i}" for i in range(1, 9))


def test_same_keys_with_consistent_random_show_kcat_placement(tmp_path):
    keys = "".join(f"user_{i};x\n" for i in range(1, 11)).encode()
    cfg = tmp_path / "p.yaml"
    cfg.write_text("topics:\n  kcat_copy:\n    partitions: 4\n    value: string\n")
    code, _, err = lake_cli(
        tmp_path / "lake", "--config", str(cfg), "produce", "kcat_copy", "-K", ";",
        "--partitioner", "consistent_random", stdin=keys,
    )  # fmt: skip
    assert code == 0, err
    prefix = os.environ["LAKE_KAFKA_TOPIC_PREFIX"]
    assert f"produced 10 records (0 tombstones) to {prefix}kcat_copy with consistent_random" in err
    _, out, _ = lake_cli(tmp_path / "lake", "--config", str(cfg), "consume", "kcat_copy", "-f", "%k,%p\\n")
    got = dict(line.split(",") for line in out.splitlines())
    assert got == {f"user_{i}": str(zlib.crc32(f"user_{i}".encode()) % 4) for i in range(1, 11)}
    assert got != {k: str(p) for k, p in JAVA_PLACEMENT.items()}


def test_demo_dump_holds_all_ten_accounts():
    lines = demo_dump_path().read_text().splitlines()
    assert lines == [f'user_{i};"user{i}@example.com"' for i in range(1, 11)]


@pytest.mark.parametrize(
    "args,stdin,message",
    [
        (["produce", "nope"], b"a\n", "unknown topic 'nope'"),
        (["produce", "customer_accounts", "-K", ";"], b'user_1;{"a":1}\nbroken\n', "<stdin>:2: no key separator"),
        (["produce", "customer_accounts", "-K", ";"], b'user_1;{"a":1}\n\xfe;{}\n', "<stdin>:2: key is not valid UTF-8"),
        (["produce", "customer_accounts", "/no/such/file"], None, "/no/such/file: no such file"),
        (["consume", "customer_accounts", "-f", "%x"], None, "unknown format token %x"),
        (["consume", "customer_accounts", "-p", "9"], None, "has partitions 0..3, not 9"),
        (["bogus"], None, "invalid choice: 'bogus'"),
        (["backfill", "nope"], None, "unknown lookup 'nope'"),
        (["backfill", "accounts", "--from", "/no/such/dump"], None, "/no/such/dump: no such file"),
        (["backfill", "accounts", "--max-rejects", "-1"], None, "--max-rejects must not be negative"),
        (["check", "nosuite"], None, "unknown suite 'nosuite'"),
        (["topic", "repartition", "nope"], None, "unknown topic 'nope'"),
        (["run", "nope", "--once"], None, "unknown join 'nope'"),
        (["run", "consents_with_mail"], None, "one of the arguments --once --continuous is required"),
        (["run", "consents_with_mail", "--once", "--continuous"], None, "not allowed with argument"),
        (["run", "consents_with_mail", "--continuous", "--trigger", "0"], None, "--trigger must be a positive"),
        (["audit", "consents_with_mail"], None, "has no result yet: run 'lake run consents_with_mail --once'"),
        (["backfill", "accounts", "--from", "s3://bucket/dump"], None, "s3://bucket/dump: no file system for s3:// here; a dump is a local file or s3a://"),
        (["backfill", "accounts", "--from", "file:///no/such/dump"], None, "/no/such/dump: no such file"),
        (["health", "nope"], None, "unknown join 'nope'"),
        (["health", "--max-behind", "-1"], None, "--max-behind must not be negative"),
        (["dbt"], None, "give a dbt command, e.g. 'lake dbt build'"),
        (["connect", "start", "--connect-port", "70000"], None, "port 70000 is not a TCP port (1..65535)"),
    ],
)  # fmt: skip
def test_user_errors_are_one_line_exit_2_and_write_nothing(tmp_path, args, stdin, message):
    root = tmp_path / "lake"
    lake_cli(root, "demo", "--topics-only")
    before = kafka_ends(root)
    code, out, err = lake_cli(root, *args, stdin=stdin)
    assert code == 2
    assert err.startswith("lake: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert message in err
    assert kafka_ends(root) == before
    assert not (root / "tables").exists()


def kafka_ends(root):
    """The end offsets of the demo topics on Kafka: any write moves them (records and commit markers)."""
    from spark_jobs.config import load_config
    from spark_jobs.seams.kafka import connect, watermarks

    config = load_config(None)
    cluster = connect(config, root)
    return [watermarks(cluster, config.topic(t)) for t in ("customer_consents", "customer_accounts")]


def test_kafka_errors_are_one_line_exit_2(tmp_path, kafka):
    root = tmp_path / "lake"
    port = str(kafka.address).rsplit(":", 1)[1]
    code, _, err = lake_cli(root, "kafka", "start", "--port", port)
    assert code == 2 and err == (
        f"lake: error: port {port} on 127.0.0.1 is already taken by another process; choose another with --port\n"
    )
    unreachable = {**os.environ, "LAKE_KAFKA_BOOTSTRAP": "127.0.0.1:1", "LAKE_KAFKA_TIMEOUT": "2"}
    proc = subprocess.run(
        [sys.executable, "-m", "spark_jobs.cli", "--root", str(root), "consume", "customer_accounts"],
        capture_output=True, text=True, env=unreachable,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(
        "lake: error: Kafka at 127.0.0.1:1 ($LAKE_KAFKA_BOOTSTRAP): cannot read the cluster's topics: "
    )
    code, out, _ = lake_cli(root, "kafka", "status", "--json")
    assert code == 0 and json.loads(out)["running"] is False  # this root has no broker of its own


def test_health_says_which_join_is_down_and_exits_1(tmp_path):
    root = tmp_path / "lake"
    lake_cli(root, "demo", "--topics-only")
    code, out, err = lake_cli(root, "health", "consents_with_mail")
    assert (code, err) == (1, "")
    assert out == (
        "UNHEALTHY: the continuous ingest of consents is down, so the bronze tables fall behind the topics "
        "(the joins read Kafka and are not affected); start it with 'lake ingest --continuous --detach'\n"
        "UNHEALTHY: join consents_with_mail is down (no batch yet); start it with 'lake start consents_with_mail'\n"
    )
    code, out, _ = lake_cli(root, "health", "--max-behind", "3")
    assert code == 1 and out.count("UNHEALTHY: ") == 3


def test_a_killed_join_whose_pid_is_a_zombie_is_down(tmp_path):
    """A join killed -9 stays a zombie until the process that started it reaps it: its pid still
    exists then. `lake status` and `lake health` call the join down, not running."""
    import time

    root = tmp_path / "lake"
    lake_cli(root, "demo", "--topics-only")
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    jobs = root / "_jobs"
    jobs.mkdir(parents=True)
    (jobs / "consents_with_mail.json").write_text(
        json.dumps({"job": "join:consents_with_mail", "pid": killed.pid, "mode": "continuous"})
    )
    code, out, _ = lake_cli(root, "status")
    assert code == 0 and f"consents_with_mail (table): running (pid {killed.pid})" in out
    killed.kill()  # not reaped: a zombie while this test runs
    stat = Path(f"/proc/{killed.pid}/stat")
    for _ in range(100):
        if stat.read_text().split(")")[-1].split()[0] == "Z":
            break
        time.sleep(0.05)
    try:
        code, out, _ = lake_cli(root, "status")
        assert code == 0 and "consents_with_mail (table): stopped" in out
        code, out, _ = lake_cli(root, "health", "consents_with_mail")
        assert code == 1 and "UNHEALTHY: join consents_with_mail is down (no batch yet)" in out
    finally:
        killed.wait()


def _tell_the_demo(root) -> tuple[int, str, str]:
    """``lake demo consents marketplace people`` through the CLI's entry point in this process."""
    # the demo writes records' bytes to sys.stdout.buffer, as `lake consume` does
    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True) for _ in range(2))
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--root", str(root), "demo", "consents", "marketplace", "people"])
    return code, *(stream.buffer.getvalue().decode() for stream in (out, err))  # type: ignore[return-value]


@pytest.fixture(scope="module")
def demo_lake(spark, tmp_path_factory):
    """``make demo``'s lake: ``lake demo consents marketplace people``, the consents story, then the
    marketplace and people stories on the same root, as one command, with the root's own embedded
    Schema Registry as ``make demo`` starts it (this module's commands reach it through
    $LAKE_SCHEMA_REGISTRY_URL). It runs through the CLI's entry point in this process, on the run's
    Spark session (a process of its own took a minute longer, most of it a cold JVM's compiling); the
    commands above and below run ``lake`` as processes."""
    root = tmp_path_factory.mktemp("demo") / "lake"
    port = str(free_port())
    assert main(["--root", str(root), "registry", "start", "--port", port]) == 0
    env = pytest.MonkeyPatch()
    env.setenv("LAKE_SCHEMA_REGISTRY_URL", f"http://127.0.0.1:{port}/apis/ccompat/v7")
    try:
        code, out, err = _tell_the_demo(root)
        consents, stories = out.split("== the marketplace pipeline (marketplace.yaml)")
        yield (
            root,
            (code, consents, err),
            (code, "== the marketplace pipeline (marketplace.yaml)" + stories, err),
            os.environ.get("LAKE_KAFKA_TOPIC_PREFIX", ""),  # the demo's topics' names on Kafka begin with it
        )
    finally:
        env.undo()
        main(["--root", str(root), "registry", "stop"])


@pytest.mark.slow
@pytest.mark.integration
def test_make_demo_story_fails_the_gate_then_backfills_and_passes(demo_lake):
    """`make demo`'s job as a user sees it: topics -> failing completeness -> backfill -> passing gate
    -> the table-table join complete, the stream-table join without the late accounts -> clean audits."""
    code, out, err = demo_lake[1]
    assert code == 0, err
    before, after = out.split("== 3. backfill the accounts lookup from the database dump")
    assert (
        "FAIL  completeness:customer_consents->accounts: Every key that customer_consents references exists "
        "in lookup accounts. FAILED: 2 keys missing in accounts: user_10 (referenced by 1 record(s) of "
        "customer_consents, first at partition 1 offset 2, last at partition 1 offset 2); user_9 (referenced "
        "by 1 record(s) of customer_consents, first at partition 2 offset 4, last at partition 2 offset 4)."
    ) in before
    report = before.split("report: ")[1].split("\n")[0]
    with open(report, encoding="utf-8") as page:  # the failing run's own report page stays on disk
        assert "user_9 (referenced by 1 record(s)" in page.read()
    assert (
        "10 lines read, 2 new keys, 0 changed, 8 unchanged, 0 superseded duplicates, 0 rejected; wrote 2 records"
        in after
    )
    after, joins = after.split("== 5. table-table join consents_with_mail")
    assert "FAIL" not in after and after.count("PASS  ") == 6  # with the framing census of the Avro consents
    assert after.rstrip().endswith("The gate of consents passes: its streaming joins may start.")
    table, stream = joins.split("== 6. stream-table join")
    rows = [line.split() for line in table.splitlines() if line.startswith("  user_")]
    assert rows == [
        [f"user_{n}", str(n % 3 != 0), str(n % 2 == 1), f"user{n}@example.com"]
        for n in (1, 10, 2, 3, 4, 5, 6, 7, 8, 9)
    ]
    stream, audits = stream.split("== 7. audit")
    first, second = stream.split("A consent event that arrives now, after the backfill, is enriched:")
    events = [line.split() for line in first.splitlines() if line.startswith("  user_")]
    mail = {n: f"user{n}@example.com" for n in range(1, 9)} | {9: "null", 10: "null"}
    assert events == [
        [f"user_{n}", "2026-01-01T00:00:00+00:00", mail[n]] for n in (1, 10, 2, 3, 4, 5, 6, 7, 8, 9)
    ]
    late = [line.split() for line in second.splitlines() if line.startswith("  user_9")]
    assert [row[2] for row in late] == ["null", "user9@example.com"]
    assert audits.count(": identical") == 2


@pytest.mark.slow
@pytest.mark.integration
def test_demo_marketplace_and_people_are_gated_then_show_fk_moves_fan_out_and_list_edits(demo_lake):
    code, out, err = demo_lake[2]
    assert code == 0, err
    marketplace, people = out.split("== the people pipeline (people.yaml)")

    # each pipeline's gate: completeness names the missing merchants / addresses, the backfill adds
    # them, the suites pass, and only then do the joins run
    for text, failing, backfill, passing in (
        (
            marketplace,
            "FAIL  completeness:display_products:products->merchants: Every foreign key that products "
            "references exists in lookup merchants (join display_products). FAILED: 2 foreign keys missing in "
            "merchants: m2 (referenced by 1 record(s) of products (keys p3), first at partition 0 offset 0, "
            "last at partition 0 offset 0); m3 (referenced by 1 record(s) of products (keys p5), first at "
            "partition 1 offset 0, last at partition 1 offset 0).",
            "3 lines read, 2 new keys, 0 changed, 1 unchanged, 0 superseded duplicates, 0 rejected; "
            "wrote 2 records to merchants",
            4,
        ),
        (
            people,
            "FAIL  completeness:people_with_addresses:persons->addresses: Every list element that persons "
            "references exists in lookup addresses (join people_with_addresses). FAILED: 2 list elements "
            "missing in addresses: a3 (referenced by 1 record(s) of persons (keys bob), first at partition 0 "
            "offset 1, last at partition 0 offset 1); a4 (referenced by 1 record(s) of persons (keys bob), "
            "first at partition 0 offset 1, last at partition 0 offset 1).",
            "4 lines read, 2 new keys, 0 changed, 2 unchanged, 0 superseded duplicates, 0 rejected; "
            "wrote 2 records to addresses",
            5,  # with the framing census of the Protobuf persons
        ),
    ):
        before, after = text.split(": backfill the ")
        assert failing in before and before.count("FAIL  ") == 1 and before.count("PASS  ") == passing
        gate, joins = after.split("may start.")
        assert backfill in gate and "FAIL" not in gate.split(": quality suites after the backfill")[1]
        assert " batch " not in before + gate  # no join ran before the gate passed
        assert " batch 0: " in joins

    def table(step: str, join: str) -> list[list[str]]:
        block = out.split(step)[1].split(f"{join}:\n")[1]
        lines = []
        for line in block.splitlines()[1:]:
            if not line.startswith("  "):
                break
            lines.append([cell.strip() for cell in line.strip().split("  |  ")])
        return lines

    assert table("marketplace 1. the joins start", "display_products") == [
        ["p1", "Claw hammer", "19.90", "m1", "Acme Tools", "Oslo"],
        ["p2", "Spirit level", "24.50", "m1", "Acme Tools", "Oslo"],
        ["p3", "Cordless drill", "89.00", "m2", "Bolt Supplies", "Bergen"],
        ["p4", "Gift card", "25.00", "null", "null", "null"],
        ["p5", "Wood screws", "7.50", "m3", "Cobalt Hardware", "Stavanger"],
    ]
    moved = table("marketplace 2. FK change", "display_products")
    assert moved[1] == ["p2", "Spirit level", "24.50", "m2", "Bolt Supplies", "Bergen"]
    fanned = table("marketplace 3. merchant update fans out", "display_products")
    assert fanned == [
        ["p1", "Claw hammer", "19.90", "m1", "Acme Tools & Co", "Trondheim"],
        ["p2", "Spirit level", "24.50", "m2", "Bolt Supplies", "Bergen"],
        ["p3", "Cordless drill", "89.00", "m2", "Bolt Supplies", "Bergen"],
        ["p4", "Gift card", "25.00", "null", "null", "null"],
        ["p5", "Wood screws", "7.50", "m3", "Cobalt Hardware", "Stavanger"],
    ]
    assert "join display_products batch 2: in 0+1, quarantined 0, affected 1, upserted 1" in out
    assert table("marketplace 3.", "merchants_by_name") == [
        ["Acme Tools & Co", "m1", "Trondheim"],
        ["Bolt Supplies", "m2", "Bergen"],
        ["Cobalt Hardware", "m3", "Stavanger"],
    ]
    assert table("people 1.", "people_with_addresses") == [
        ["ann", "Ann", "[a1: Storgata 1, Oslo; a2: Bryggen 5, Bergen]"],
        ["bob", "Bob", "[a3: Nidarosveien 9, Trondheim; a4: Torget 2, Tromsø]"],
        ["cy", "Cy", "[]"],
    ]
    added = table("people 2.", "people_with_addresses")
    assert added == [
        ["ann", "Ann", "[a1: Storgata 1, Oslo; a2: Bryggen 5, Bergen; a3: Nidarosveien 9, Trondheim]"],
        ["bob", "Bob", "[a3: Nidarosveien 9, Trondheim; a4: Torget 2, Tromsø]"],
        ["cy", "Cy", "[a5: (unknown)]"],
    ]
    assert "elements joined 2, retracted 0, kept 2" in out.split("people 2.")[1].split("people 3.")[0]
    removed = table("people 3.", "people_with_addresses")
    assert removed == [
        ["ann", "Ann", "[a1: Storgata 1A, Oslo; a2: Bryggen 5, Bergen; a3: Nidarosveien 9, Trondheim]"],
        ["bob", "Bob", "[a4: Torget 2, Tromsø]"],
        ["cy", "Cy", "[a5: Elvegata 3, Kristiansand]"],
    ]
    assert "elements joined 2, retracted 1, kept 3" in out.split("people 3.")[1]
    # each join's audit: the result equals the batch join of its topics up to the offsets it read
    assert [line for line in out.splitlines() if line.startswith("audit ")] == [
        "audit display_products: 5 result rows, 5 expected by the batch join of products up to offsets "
        "[2, 2, 6], merchants up to offsets [6, 2]: identical",
        "audit merchants_by_name: 3 result rows, 3 expected by the batch join of merchants up to offsets "
        "[6, 2]: identical",
        "audit people_with_addresses: 3 result rows, 3 expected by the batch join of persons up to offsets "
        "[9, 0], addresses up to offsets [6, 2, 4]: identical",
    ]


def run_results(root) -> dict[str, tuple[str, int | None]]:
    """dbt's run_results.json of the last ``lake dbt`` on ``root``: node name -> (status, failures)."""
    import json

    results = json.loads((root / "dbt" / "target" / "run_results.json").read_text())["results"]

    def name(
        unique_id: str,
    ) -> str:  # test.lake.<name>.<hash>, unit_test.lake.<model>.<name>, model.lake.<name>
        parts = unique_id.split(".")
        return parts[2] if parts[0] == "test" else parts[-1]

    return {name(r["unique_id"]): (r["status"], r["failures"]) for r in results}


def sql_rows(root, query: str) -> list[list[str]]:
    return sql_blocks(root, query)[0]


def sql_blocks(root, *queries: str) -> list[list[list[str]]]:
    """The rows (tab-separated cells, without the header) of each query, from one ``lake sql``."""
    code, out, err = lake_cli(root, "sql", *queries)
    assert code == 0, err
    blocks = out.rstrip("\n").split("\n\n")
    assert len(blocks) == len(queries), out
    return [[line.split("\t") for line in block.splitlines()[1:]] for block in blocks]


def _explained(root: Path, *args: str) -> dict:
    """``lake explain ... --json`` on the demo's lake, through the CLI's entry point in this process."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    with contextlib.redirect_stdout(out):
        assert main(["--root", str(root), *args, "--json"]) == 0
    return json.loads(out.buffer.getvalue().decode())


@pytest.mark.slow
@pytest.mark.integration
def test_explain_on_the_demo_lake_names_each_rows_records_the_gate_and_why_a_side_is_empty(
    demo_lake, monkeypatch
):
    root = demo_lake[0]
    monkeypatch.setenv("LAKE_KAFKA_TOPIC_PREFIX", demo_lake[3])  # the demo's topics
    # user_9's account was backfilled after the gate failed: both records, where they belong
    answer = _explained(root, "explain", "consents_with_mail", "user_9")
    assert answer["rows"][0]["contactMailAddress"] == "user9@example.com"
    assert [(s["role"], s["topic"], s["partition"], s["placement"]) for s in answer["sources"][0]] == [
        ("left", "customer_consents", 2, None),
        ("right", "customer_accounts", 2, None),
    ]
    assert answer["sources"][0][1]["value"] == {
        "customerId": "user_9",
        "contactMailAddress": "user9@example.com",
    }
    assert answer["reasons"] == []
    (gate,) = answer["gate"]
    assert (gate["check"], gate["success"], gate["since"]["success"]) == (
        "completeness:customer_consents->accounts",
        False,
        True,
    )
    assert gate["finding"].startswith("user_9 (referenced by 1 record(s) of customer_consents")
    assert Path(gate["report"]).is_file()
    # the stream-table join's first user_10 event was decided before the account was backfilled
    answer = _explained(root, "explain", "consents_enriched_at_event_time", "user_10")
    assert answer["rows"][0]["contactMailAddress"] is None
    (reason,) = answer["reasons"]
    assert reason["text"].startswith(
        "the event (timestamp 2026-01-01T00:00:00.000+00:00) was decided before the table's record "
        "arrived: customer_accounts partition 1 offset "
    )
    assert reason["fix"] == "lake backfill accounts before the events are produced"
    # the gift card has no merchant_id: its right side is empty for that reason
    marketplace = Path(demo_pipelines.__file__).parent / "pipelines" / "marketplace.yaml"
    answer = _explained(root, "--config", str(marketplace), "explain", "display_products", "p4")
    assert answer["reasons"] == [
        {
            "side": "right",
            "text": "the left record's foreign key (merchant_id) is null",
            "fix": None,
            "nothing": False,
        }
    ]


@pytest.mark.slow
@pytest.mark.integration
def test_dbt_build_on_the_demo_lake_and_the_marts_in_a_new_process(demo_lake):
    root = demo_lake[0]
    code, out, err = lake_cli(root, "dbt", "build")
    assert code == 0, out + err
    results = run_results(root)
    models = {
        "stg_accounts", "stg_consents", "stg_display_products", "stg_people_with_addresses",
        "stg_quality_runs", "stg_quarantine", "optout_feed", "display_products",
        "people_with_addresses", "dq_daily",
    }  # fmt: skip
    assert models <= set(results)
    assert {
        "optout_feed_one_row_per_refused_retargeter",
        "people_with_addresses_counts_known_addresses",
        "dq_daily_counts_runs_and_keeps_the_last_offending_count",
    } <= set(results)  # the unit tests ran
    assert {status for status, _ in results.values()} == {"success", "pass"}
    assert "relationships_stg_consents_customer_id__customer_id__ref_stg_accounts_" in results
    assert "Completed successfully" in out

    # the marts persist: a new process (a new Spark session) reads them from the lake's catalog, the
    # jobs' tables are catalog tables of the lake's metastore, dbt's views persist (one `lake sql`
    # answers several queries, each its own block)
    opt_out = [
        (n, r) for n in range(1, 11) for r in (1, 2) if (r == 1 and n % 3 == 0) or (r == 2 and n % 2 == 0)
    ]
    daily_sql = (
        "SELECT check_name, sum(passes), sum(failures), max_by(offending_keys, last_run_time) "
        "FROM marts.dq_daily WHERE pipeline = 'consents' GROUP BY check_name ORDER BY 1, 2"
    )
    feed, products, staged, marts, people, daily = sql_blocks(
        root,
        "SELECT * FROM marts.optout_feed ORDER BY customer_id, retargeter",
        "SELECT cast(key AS string) FROM lake.display_products ORDER BY 1",
        "SELECT count(*) FROM staging.stg_display_products",
        "SELECT product_id, merchant_name FROM marts.display_products ORDER BY 1",
        "SELECT person_id, address_count, known_address_count FROM marts.people_with_addresses ORDER BY 1",
        daily_sql,
    )
    assert feed == sorted([f"user_{n}", f"retargeter{r}", f"user{n}@example.com"] for n, r in opt_out)
    assert products == [["p1"], ["p2"], ["p3"], ["p4"], ["p5"]]
    assert staged == [["5"]]
    assert marts == [
        ["p1", "Acme Tools & Co"], ["p2", "Bolt Supplies"], ["p3", "Bolt Supplies"], ["p4", ""],
        ["p5", "Cobalt Hardware"],
    ]  # fmt: skip
    assert people == [["ann", "3", "3"], ["bob", "1", "1"], ["cy", "1", "1"]]
    # the demo ran the consents suite twice: completeness failed, then passed; the rest passed twice
    assert daily == [
        ["co_partitioning:customer_consents+customer_accounts", "4", "0", "0"],
        ["completeness:customer_consents->accounts", "1", "1", "0"],
        ["framing:customer_consents+customer_accounts", "2", "0", "0"],
        ["key_format:customer_consents+customer_accounts", "2", "0", "0"],
        ["lookup_basics:accounts", "2", "0", "0"],
    ]
    # two at once take turns on the catalog (embedded Derby serves one process): both answer
    both = [
        subprocess.Popen(
            [sys.executable, "-m", "spark_jobs.cli", "--root", str(root), "sql", query],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for query in ("SELECT count(*) FROM marts.optout_feed", "SELECT count(*) FROM marts.display_products")
    ]
    answers = [proc.communicate() for proc in both]
    assert [proc.returncode for proc in both] == [0, 0], answers
    assert [out.splitlines()[1] for out, _ in answers] == [str(len(opt_out)), "5"]
    assert sum("waiting for another process to finish catalog" in err for _, err in answers) == 1
    for mart in ("optout_feed", "display_products", "people_with_addresses", "dq_daily"):
        assert (root / "warehouse" / "marts.db" / mart / "_delta_log").is_dir()  # Delta, under the root

    # dq_daily is incremental: a second build merges the last day's rows again, nothing doubles
    code, out, err = lake_cli(root, "dbt", "run", "--select", "dq_daily")
    assert code == 0, out + err
    log = root / "warehouse" / "marts.db" / "dq_daily" / "_delta_log"
    last = max(log.glob("*.json"))
    operations = [json.loads(line)["commitInfo"]["operation"] for line in last.open() if "commitInfo" in line]
    assert operations == ["MERGE"]
    assert sql_rows(root, daily_sql) == daily


ACCOUNTS = pa.schema(
    [("key", pa.binary()), ("value", pa.binary()), ("partition", pa.int32()), ("offset", pa.int64()),
     ("timestamp", pa.timestamp("us", tz="UTC")), ("topic_version", pa.int64())]
)  # fmt: skip
CONSENTS = pa.schema(
    [("key", pa.binary()), ("customerId", pa.string()), ("retargeter1", pa.bool_()),
     ("retargeter2", pa.bool_()), ("contactMailAddress", pa.string())]
)  # fmt: skip


def _accounts(users):
    from datetime import UTC, datetime

    return pa.table(
        {
            "key": [u.encode() for u in users],
            "value": [
                f'{{"customerId":"{u}","contactMailAddress":"{u}@example.com"}}'.encode() for u in users
            ],
            "partition": [0] * len(users),
            "offset": list(range(len(users))),
            "timestamp": [datetime(2026, 11, 1, tzinfo=UTC)] * len(users),
            "topic_version": [1] * len(users),
        },
        schema=ACCOUNTS,
    )


@pytest.mark.slow
@pytest.mark.integration
def test_dbt_relationships_test_fails_while_accounts_are_incomplete(tmp_path):
    from spark_jobs.seams.delta import Lake

    root = tmp_path / "lake"
    lake = Lake(root)
    users = [f"user_{n}" for n in range(1, 5)]
    lake.create("consents_with_mail", CONSENTS)
    lake.append(
        "consents_with_mail",
        pa.table(
            {
                "key": [u.encode() for u in users],
                "customerId": users,
                "retargeter1": [True, False, True, False],
                "retargeter2": [True, True, False, False],
                "contactMailAddress": ["user_1@example.com", "user_2@example.com", None, None],
            },
            schema=CONSENTS,
        ),
    )
    lake.create("lookup_accounts", ACCOUNTS)
    lake.append("lookup_accounts", _accounts(users[:2]))  # user_3 and user_4 have no account yet
    select = ["--select", "stg_accounts", "stg_consents", "--indirect-selection", "cautious"]
    code, out, err = lake_cli(root, "dbt", "build", *select)
    assert code == 1, out + err
    results = run_results(root)
    failed = {name: r for name, r in results.items() if r[0] not in ("success", "pass")}
    assert failed == {"relationships_stg_consents_customer_id__customer_id__ref_stg_accounts_": ("fail", 2)}

    # the same test passing once accounts are complete: the demo lake's build
    # (test_dbt_build_on_the_demo_lake_and_the_marts_in_a_new_process)

    # the second of two queries fails: one line naming it, and not even the first one's rows
    code, out, err = lake_cli(
        root, "sql", "SELECT count(*) FROM lake.consents_with_mail", "SELECT nope FROM marts.none"
    )
    lines = err.splitlines()  # the command's own lines: what the JVM prints is in <root>/_logs/sql.log
    assert code == 2 and "Traceback" not in err and out == ""
    assert lines[0] == "starting Spark with the lake's catalog ..."
    assert len(lines) == 2
    assert lines[1].startswith("lake: error: query 2 of 2 failed: [TABLE_OR_VIEW_NOT_FOUND]")


def test_the_makefiles_python_lines_run(tmp_path):
    """``make demo`` ends by printing the report's address through a Python one-liner: it must still
    import what it names after the modules move (it once failed, silently, at the demo's end)."""
    import re

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    lines = re.findall(r"\$\(BIN\)/python -c '([^']+)'", makefile)
    assert lines
    for line in lines:
        done = subprocess.run(
            [sys.executable, "-c", line],
            capture_output=True,
            text=True,
            env={**os.environ, "LAKE_ROOT": str(tmp_path / "lake")},
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == str(tmp_path / "lake" / "reports" / "quality" / "index.html")


@pytest.mark.slow
@pytest.mark.integration
def test_make_demo_a_second_time_after_a_registry_restart_tells_the_stories_again(demo_lake, monkeypatch):
    """The demo again on the same root, its registry stopped and started between (as `lake down`
    then `make demo` does): every Avro and Protobuf record still decodes by its schema id, the gate
    passes at once (the lookups were backfilled), the backfills find nothing to write, the joins
    show the same results and every audit is clean."""
    root, (_, first, _), (_, first_stories, _), prefix = demo_lake
    monkeypatch.setenv("LAKE_KAFKA_TOPIC_PREFIX", prefix)  # the demo's topics
    assert main(["--root", str(root), "registry", "stop"]) == 0
    port = str(free_port())  # the stopped one's may be taken by now: it is in the ephemeral range
    assert main(["--root", str(root), "registry", "start", "--port", port]) == 0
    monkeypatch.setenv("LAKE_SCHEMA_REGISTRY_URL", f"http://127.0.0.1:{port}/apis/ccompat/v7")
    code, out, err = _tell_the_demo(root)
    assert code == 0, err
    assert "customer_consents: already has records, left as it is" in out
    assert (
        "the marketplace topics already have records" in out
        and "the people topics already have records" in out
    )
    assert "FAIL" not in out
    consents, stories = out.split("== the marketplace pipeline (marketplace.yaml)")
    assert "10 lines read, 0 new keys, 0 changed, 10 unchanged" in consents
    table = consents.split("== 5. table-table join consents_with_mail")[1].split("== 6.")[0]
    rows = [line.split() for line in table.splitlines() if line.startswith("  user_")]
    assert rows == [
        [f"user_{n}", str(n % 3 != 0), str(n % 2 == 1), f"user{n}@example.com"]
        for n in (1, 10, 2, 3, 4, 5, 6, 7, 8, 9)
    ]
    audits = [line for line in out.splitlines() if line.startswith("audit ")]
    assert len(audits) == (first + first_stories).count("\naudit ") == 5
    assert all(line.endswith(": identical") for line in audits), audits
