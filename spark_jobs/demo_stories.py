"""The foreign-key, list and derive demos (``lake demo marketplace people``): small readable topics
written step by step, with the continuous joins run after each step and their results printed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spark_jobs.config import PipelineConfig, bundled_config_path, load_config
from spark_jobs.demo import DEMO_TIMESTAMP_MS, is_empty, json_records
from spark_jobs.kafka import Cluster, connect, ensure_topics, produce
from spark_jobs.lake import Lake

Records = dict[str, list[tuple[str, dict | None]]]  # topic -> (key, value or None for a tombstone)


@dataclass
class Step:
    title: str
    records: Records
    note: str = ""


@dataclass
class Story:
    name: str
    pipeline: str  # the bundled pipeline file
    steps: list[Step]
    show: dict[str, list[str]] = field(default_factory=dict)  # join -> columns to print

    def config(self) -> PipelineConfig:
        return load_config(bundled_config_path(self.pipeline))


def _merchant(name: str, city: str) -> dict:
    return {"name": name, "city": city}


def _product(title: str, price: float, merchant: str | None) -> dict:
    value: dict[str, Any] = {"title": title, "price": price}
    if merchant is not None:
        value["merchant_id"] = merchant
    return value


MARKETPLACE = Story(
    "marketplace",
    "marketplace.yaml",
    [
        Step(
            "products arrive before their merchants",
            {
                "products": [
                    ("p1", _product("Claw hammer", 19.9, "m1")),
                    ("p2", _product("Spirit level", 24.5, "m1")),
                    ("p3", _product("Cordless drill", 89.0, "m2")),
                    ("p4", _product("Gift card", 25.0, None)),
                ],
            },
            "A left join emits them with an empty merchant for now. p4 has no merchant_id: an inner\n"
            "join would count it as a null foreign key and leave it out.",
        ),
        Step(
            "the merchants arrive",
            {
                "merchants": [
                    ("m1", _merchant("Acme Tools", "Oslo")),
                    ("m2", _merchant("Bolt Supplies", "Bergen")),
                ],
            },
            "Each merchant reached the products pointing at it: the right side arriving later joins too.",
        ),
        Step(
            "FK change: p2 moves from Acme Tools (m1) to Bolt Supplies (m2)",
            {"products": [("p2", _product("Spirit level", 24.5, "m2"))]},
            "p2 now shows Bolt Supplies. Acme Tools no longer affects it (next step).",
        ),
        Step(
            "merchant update fans out: Acme Tools becomes 'Acme Tools & Co' and moves to Trondheim",
            {"merchants": [("m1", _merchant("Acme Tools & Co", "Trondheim"))]},
            "Every product currently pointing at m1 (only p1 since p2 moved) got a new row, found\n"
            "through the subscription store (merchant_id -> product) without reading other products.\n"
            "merchants_by_name (derive) deleted the old name's row and inserted the new one.",
        ),
    ],
    {
        "display_products": ["key", "title", "price", "merchant_id", "merchant", "merchant_city"],
        "merchants_by_name": ["key", "merchant_id", "city"],
    },
)


def _person(name: str, addresses: list[str]) -> dict:
    return {"name": name, "address_ids": addresses}


def _address(street: str, city: str) -> dict:
    return {"street": street, "city": city}


PEOPLE = Story(
    "people",
    "people.yaml",
    [
        Step(
            "persons with address lists; a4 is not known yet, and Cy has an empty list",
            {
                "addresses": [
                    ("a1", _address("Storgata 1", "Oslo")),
                    ("a2", _address("Bryggen 5", "Bergen")),
                    ("a3", _address("Nidarosveien 9", "Trondheim")),
                ],
                "persons": [
                    ("ann", _person("Ann", ["a1", "a2"])),
                    ("bob", _person("Bob", ["a3", "a4"])),
                    ("cy", _person("Cy", [])),
                ],
            },
            "Lists keep their order; Bob's a4 has no address yet, so it stays in place unmatched.",
        ),
        Step(
            "an address is added to Ann's list, and a4 arrives",
            {
                "persons": [("ann", _person("Ann", ["a1", "a2", "a3"]))],
                "addresses": [("a4", _address("Torget 2", "Tromsø"))],
            },
            "Only the new elements were joined (the metrics line: elements joined 2 -- Ann's a3 and\n"
            "Bob's a4 -- and kept 3); Ann's a1 and a2 were not looked up again.",
        ),
        Step(
            "an address is removed from Bob's list, and Oslo's street is renamed",
            {
                "persons": [("bob", _person("Bob", ["a4"]))],
                "addresses": [("a1", _address("Storgata 1A", "Oslo"))],
            },
            "Bob's a3 was retracted; Ann's a1 was re-joined because its address changed.",
        ),
    ],
    {"people_with_addresses": ["key", "name", "addresses"]},
)

STORIES = {s.name: s for s in (MARKETPLACE, PEOPLE)}


def run_story(
    story: Story,
    lake: Lake,
    sync: Callable[[PipelineConfig, list[str]], None],
    run: Callable[[PipelineConfig, str], None],
    show: Callable[[str, list[str]], None],
    out: Callable[[str], None] = print,
) -> PipelineConfig:
    """Produce the story's steps to Kafka (once per cluster), and after each one mirror the topics
    into bronze (``sync``), run the joins and print them."""
    config = story.config()
    cluster = connect(config, lake.root)
    ensure_topics(cluster, config.topics.values())
    topics = sorted({t for step in story.steps for t in step.records})
    fresh = all(is_empty(cluster, config.topic(t)) for t in topics)
    steps = story.steps if fresh else []
    if not fresh:
        out(f"the {story.name} topics already have records: showing the joins' current results")
    for i, step in enumerate(steps, 1):
        out(f"\n-- {story.name} {i}. {step.title}")
        _produce(cluster, config, step.records, DEMO_TIMESTAMP_MS + i * 1000)
        sync(config, list(step.records))
        for join in story.show:
            run(config, join)
        for join, columns in story.show.items():
            out(f"{join}:")
            show(join, columns)
        if step.note:
            out(step.note)
    if not fresh:
        sync(config, topics)
        for join, columns in story.show.items():
            run(config, join)
            out(f"{join}:")
            show(join, columns)
    return config


def _produce(cluster: Cluster, config: PipelineConfig, records: Records, at_ms: int) -> None:
    for topic, items in records.items():
        produce(cluster, config.topic(topic), [json_records(items)], "murmur2", timestamp_ms=at_ms)
