"""The foreign-key, list and derive demos (``lake demo marketplace people``): small readable topics
written step by step, with the continuous joins run after each step and their results printed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spark_jobs.config import PipelineConfig, bundled_config_path, load_config
from spark_jobs.demo.data import DEMO_TIMESTAMP_MS, encoded, is_empty
from spark_jobs.formats import Formats
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.kafka import Cluster, connect, ensure_topics, produce

Records = dict[str, list[tuple[str, dict | None]]]  # topic -> (key, value or None for a tombstone)


@dataclass
class Step:
    title: str
    records: Records
    note: str = ""


@dataclass
class Story:
    """A pipeline's demo: the topics as they are before the gate (the lookup lacks entities that
    the left side references), then the steps that run with the joins started."""

    name: str
    pipeline: str  # the bundled pipeline file
    before: Step  # produced before the quality gate
    steps: list[Step]
    show: dict[str, list[str]] = field(default_factory=dict)  # join -> columns to print

    def config(self) -> PipelineConfig:
        return load_config(bundled_config_path(self.pipeline))

    def topics(self) -> list[str]:
        """The topics the story writes, before the gate and in its steps."""
        return sorted({t for step in [self.before, *self.steps] for t in step.records})


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
    Step(
        "products reference merchants m1, m2 and m3; the merchants topic only knows m1",
        {
            "merchants": [("m1", _merchant("Acme Tools", "Oslo"))],
            "products": [
                ("p1", _product("Claw hammer", 19.9, "m1")),
                ("p2", _product("Spirit level", 24.5, "m1")),
                ("p3", _product("Cordless drill", 89.0, "m2")),
                ("p4", _product("Gift card", 25.0, None)),
                ("p5", _product("Wood screws", 7.5, "m3")),
            ],
        },
        "The merchants topic was started after the shop had merchants. p4 has no merchant_id: it\n"
        "references nothing.",
    ),
    [
        Step(
            "the joins start: every product with its merchant",
            {},
            "A left join keeps p4 with an empty merchant.",
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
    Step(
        "persons with address lists; the addresses topic only knows a1 and a2, and Cy's list is empty",
        {
            "addresses": [
                ("a1", _address("Storgata 1", "Oslo")),
                ("a2", _address("Bryggen 5", "Bergen")),
            ],
            "persons": [
                ("ann", _person("Ann", ["a1", "a2"])),
                ("bob", _person("Bob", ["a3", "a4"])),
                ("cy", _person("Cy", [])),
            ],
        },
        "Bob's a3 and a4 come from the address register, which was never sent to the topic.",
    ),
    [
        Step(
            "the join starts: every list enriched in its order",
            {},
            "An empty list references nothing and stays empty.",
        ),
        Step(
            "an address is added to Ann's list, and Cy's first address a5 is not known yet",
            {
                "persons": [
                    ("ann", _person("Ann", ["a1", "a2", "a3"])),
                    ("cy", _person("Cy", ["a5"])),
                ],
            },
            "Only the new elements were joined (Ann's a3 and Cy's a5); Ann's a1 and a2 were not looked\n"
            "up again. Cy's a5 stays in place, unmatched, until its address arrives.",
        ),
        Step(
            "a5 arrives, an address is removed from Bob's list, and Oslo's street is renamed",
            {
                "addresses": [
                    ("a5", _address("Elvegata 3", "Kristiansand")),
                    ("a1", _address("Storgata 1A", "Oslo")),
                ],
                "persons": [("bob", _person("Bob", ["a4"]))],
            },
            "Cy's a5 matched when it arrived; Bob's a3 was retracted; Ann's a1 was re-joined because its\n"
            "address changed.",
        ),
    ],
    {"people_with_addresses": ["key", "name", "addresses"]},
)

STORIES = {s.name: s for s in (MARKETPLACE, PEOPLE)}


def run_story(
    story: Story,
    lake: Lake,
    gate: Callable[[PipelineConfig], bool],
    run: Callable[[PipelineConfig, str], None],
    show: Callable[[str, list[str]], None],
    out: Callable[[str], None] = print,
) -> PipelineConfig | None:
    """Produce the story's topics to Kafka (once per cluster); pass the pipeline's quality gate
    (``gate``: suites, backfills, suites) or stop there (None); then run the joins after each step
    and print them."""
    config = story.config()
    cluster = connect(config, lake.root)
    formats = Formats(config, lake.root, cluster.topic)
    fresh = write_story_topics(story, cluster, formats)
    if fresh:
        out(f"\n-- {story.name}: {story.before.title}")
        if story.before.note:
            out(story.before.note)
    else:
        out(f"the {story.name} topics already have records: the gate, then the joins' current results")
    if not gate(config):
        return None
    for i, step in enumerate(story.steps if fresh else [], 1):
        out(f"\n-- {story.name} {i}. {step.title}")
        if step.records:
            _produce(cluster, formats, step.records, DEMO_TIMESTAMP_MS + i * 1000)
        _run_and_show(story, config, run, show, out)
        if step.note:
            out(step.note)
    if not fresh:
        _run_and_show(story, config, run, show, out)
    return config


def write_story_topics(story: Story, cluster: Cluster, formats: Formats) -> bool:
    """Produce the records the story starts from (before the gate) to ``cluster``, in the topics'
    formats, unless its topics already have records (then nothing is written). True when they were
    written now."""
    config = formats.config
    ensure_topics(cluster, config.topics.values())
    if not all(is_empty(cluster, config.topic(t)) for t in story.topics()):
        return False
    _produce(cluster, formats, story.before.records, DEMO_TIMESTAMP_MS)
    return True


def _run_and_show(story: Story, config: PipelineConfig, run, show, out) -> None:
    for join in story.show:
        run(config, join)
    for join, columns in story.show.items():
        out(f"{join}:")
        show(join, columns)


def _produce(cluster: Cluster, formats: Formats, records: Records, at_ms: int) -> None:
    for topic, items in records.items():
        spec = formats.config.topic(topic)
        produce(cluster, spec, [encoded(formats, topic, items)], "murmur2", timestamp_ms=at_ms)
