"""The lake root's embedded Schema Registry as a user meets it through the CLI: it keeps every subject,
version and id across ``lake registry stop``/``start``, ``lake down`` and a kill -9 (records produced
with schemas minutes apart are read back by their ids after each), and a registry that has lost a
topic's schemas is named as that, in one line, by ``lake check`` and at a join's start."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from spark_jobs.cli import main
from spark_jobs.seams.processes import alive, free_port, read_state

PIPELINE = """\
pipeline: kept
topics:
{topics}
"""
# H2's compaction lost the schemas only when chunks older than its retention time (45 s) were moved:
# registrations about 40 s apart, then a clean stop, lost every one with the registry's old settings
GAP_S = 40


@pytest.fixture
def own_registry(monkeypatch, tmp_path):
    """A fresh lake root whose commands use the root's own embedded registry (not the run's: they
    find it through the root's state file); stopped at the end."""
    monkeypatch.delenv("LAKE_SCHEMA_REGISTRY_URL", raising=False)
    root = tmp_path / "lake"
    yield root
    main(["--root", str(root), "registry", "stop"])


def start(capsys, *where: str) -> None:
    """``lake registry start`` on a free port, a new one each time: a port freed by a stop or a kill
    is in the range the system hands out to other processes' connections, and may be taken again."""
    code, _, err = lake(capsys, *where, "registry", "start", "--port", str(free_port()))
    assert code == 0, err


def lake(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _schema(n: int) -> dict:
    return {"type": "record", "name": f"Event{n}", "fields": [{"name": "n", "type": "int"}]}


def _produce(capsys, tmp_path, where: list[str], n: int) -> None:
    """``lake produce`` of one record to topic ``tN`` with the schema ``Event<n>`` (registered by it)."""
    (tmp_path / f"t{n}.avsc").write_text(json.dumps(_schema(n)))
    (tmp_path / f"t{n}.txt").write_text(f'k{n};{{"n": {n}}}\n')
    code, _, err = lake(
        capsys, *where, "produce", f"t{n}", str(tmp_path / f"t{n}.txt"), "-K", ";",
        "--value-schema", str(tmp_path / f"t{n}.avsc"),
    )  # fmt: skip
    assert code == 0, err


def _read_back(capsys, where: list[str], topics: range) -> list[tuple[str, str, dict]]:
    """Each topic's records as ``lake consume`` decodes them: (key, the value's schema id, value)."""
    rows = []
    for n in topics:
        code, out, err = lake(capsys, *where, "consume", f"t{n}", "-f", "%k %i %s\\n")
        assert code == 0, err
        key, schema_id, value = out.strip().split(" ", 2)
        rows.append((key, schema_id, json.loads(value)))
    return rows


@pytest.mark.slow
@pytest.mark.integration
def test_the_registry_keeps_every_schema_across_stop_start_lake_down_and_kill_9(
    own_registry, tmp_path, capsys
):
    config = tmp_path / "p.yaml"
    config.write_text(PIPELINE.format(topics="\n".join(
        f"  t{n}: {{partitions: 1, key: string, value: {{format: avro}}}}" for n in range(1, 5)
    )))  # fmt: skip
    where = ["--root", str(own_registry), "--config", str(config)]
    start(capsys, *where)
    expected = [(f"k{n}", str(n), {"n": n}) for n in range(1, 5)]

    for n in (1, 2, 3):  # a schema each, minutes apart, as a day's producers register them
        _produce(capsys, tmp_path, where, n)
        if n < 3:
            time.sleep(GAP_S)
    code, out, err = lake(capsys, *where, "registry", "stop")
    assert code == 0 and "embedded Schema Registry: stopped" in out, err
    start(capsys, *where)
    assert _read_back(capsys, where, range(1, 4)) == expected[:3]

    _produce(capsys, tmp_path, where, 4)  # registered, then the registry is killed at once
    pid = int(read_state(own_registry / "_registry" / "registry.json")["pid"])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    start(capsys, *where)
    assert _read_back(capsys, where, range(1, 5)) == expected

    code, out, err = lake(capsys, *where, "down")
    assert code == 0 and "embedded Schema Registry: stopped" in out, err
    start(capsys, *where)
    assert _read_back(capsys, where, range(1, 5)) == expected


@pytest.mark.slow
@pytest.mark.integration
def test_a_registry_that_lost_the_topics_schemas_is_named_by_check_and_at_a_joins_start(own_registry, capsys):
    """The demo's Avro consents on Kafka, then the registry's storage lost (the data folder of a
    registry replaced): ``lake check`` and ``lake run`` name the subject, the ids the records name
    and the registry, not 'register one'."""
    root = ["--root", str(own_registry)]
    start(capsys, *root)
    code, _, err = lake(capsys, *root, "demo", "--topics-only")
    assert code == 0, err
    assert lake(capsys, *root, "registry", "stop")[0] == 0
    for f in (own_registry / "_registry" / "data").iterdir():
        f.unlink()  # its storage gone, the records on the topics still naming their schema ids
    start(capsys, *root)
    url = read_state(own_registry / "_registry" / "registry.json")["url"]
    prefix = os.environ["LAKE_KAFKA_TOPIC_PREFIX"]
    lost = (
        f"lake: error: topics.customer_consents.value: the Schema Registry at {url} has lost this topic's "
        f"schemas: 10 of the last 10 records of Kafka topic {prefix}customer_consents are framed with schema "
        f"id 1 (first at partition 0 offset 0), but the registry has no subject {prefix}customer_consents-value "
        "and no schema with that id; point kafka.schema_registry at the registry that holds them, or restore "
        "this registry's storage (a schema registered again gets a new id, which no record names)\n"
    )
    for command in (["check"], ["run", "consents_with_mail", "--once"]):
        code, out, err = lake(capsys, *root, *command)
        assert (code, out, err) == (2, "", lost), command


@pytest.mark.slow
@pytest.mark.integration
def test_a_subject_nobody_registered_on_an_empty_topic_still_asks_for_one(own_registry, tmp_path, capsys):
    config = tmp_path / "p.yaml"
    config.write_text(PIPELINE.format(topics="  t1: {partitions: 1, key: string, value: {format: avro}}"))
    where = ["--root", str(own_registry), "--config", str(config)]
    start(capsys, *where)
    code, out, err = lake(capsys, *where, "consume", "t1")
    url = read_state(own_registry / "_registry" / "registry.json")["url"]
    prefix = os.environ["LAKE_KAFKA_TOPIC_PREFIX"]
    assert (code, out) == (2, "")
    assert err == (
        f"lake: error: topics.t1.value: subject {prefix}t1-value has no schema in the Schema Registry at {url}; "
        "register one, e.g. lake produce TOPIC FILE --value-schema SCHEMA_FILE\n"
    )
