"""Where a JVM's CPU went, from a Java Flight Recorder recording (``-XX:StartFlightRecording``, as
``bench_peer.py`` records the product's job with ``PEER_JFR``): per time window (a workload: produce
start -> all visible), the CPU of the JIT compiler and of the garbage collector, and the Java
execution samples (every 10-20 ms per running thread with JFR's ``profile`` settings) by what the
sampled code was doing, with the hottest methods. Read with the JDK's ``jfr`` tool.

``python tests/bench/jfr_profile.py RECORDING.jfr`` prints the whole recording's profile."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

# What a sample's code was doing: the first of these (in this order) that one of its frames matches,
# from the innermost frame out. A frame is "package.Class.method".
KINDS: list[tuple[str, re.Pattern]] = [
    (
        "publish: Kafka producer",
        re.compile(r"^(lake\.kafka\.ChangelogWriter|org\.apache\.kafka\.clients\.producer)"),
    ),
    (
        "read: Kafka consumer",
        re.compile(
            r"^(org\.apache\.kafka\.clients\.consumer|org\.apache\.kafka\.common\.record|org\.apache\.spark\.sql\.kafka010)"
        ),
    ),
    (
        "state store: RocksDB",
        re.compile(r"^(org\.rocksdb\.|org\.apache\.spark\.sql\.execution\.streaming\.state\.RocksDB)"),
    ),
    (
        "state store: encoding state rows",
        re.compile(
            r"^org\.apache\.spark\.sql\.execution\.streaming\.(state\.|.*StateEncoder|.*TransformWithState.*Encoder)"
        ),
    ),
    (
        "JSON parse / write",
        re.compile(
            r"^(com\.fasterxml\.jackson|org\.apache\.spark\.sql\.catalyst\.json|org\.apache\.spark\.sql\.catalyst\.expressions\.(JsonToStructs|StructsToJson|GetJsonObject|JsonTuple)|org\.apache\.spark\.types\.variant)"
        ),
    ),
    (
        "Row <-> Spark row conversions",
        re.compile(
            r"^(org\.apache\.spark\.sql\.catalyst\.encoders|org\.apache\.spark\.sql\.catalyst\.expressions\.objects|org\.apache\.spark\.sql\.catalyst\.CatalystTypeConverters|org\.apache\.spark\.sql\.catalyst\.expressions\.GenericRow|org\.apache\.spark\.sql\.Row)"
        ),
    ),
    ("the join operators' code", re.compile(r"^lake\.joins\.")),
    (
        "Delta / Parquet write and read",
        re.compile(
            r"^(org\.apache\.parquet|shaded\.parquet|org\.apache\.spark\.sql\.delta|io\.delta|org\.apache\.spark\.sql\.execution\.datasources)"
        ),
    ),
    (
        "shuffle and sort",
        re.compile(
            r"^(org\.apache\.spark\.shuffle|org\.apache\.spark\.util\.collection|org\.apache\.spark\.sql\.execution\.(UnsafeExternalRowSorter|UnsafeKVExternalSorter)|org\.apache\.spark\.unsafe\.map|org\.apache\.spark\.storage|net\.jpountz|com\.github\.luben)"
        ),
    ),
    ("Spark SQL generated code (projections, filters, aggregates)", re.compile(r"GeneratedClass")),
    (
        "planning: Catalyst, code generation (Janino)",
        re.compile(
            r"^(org\.apache\.spark\.sql\.catalyst|org\.codehaus\.janino|org\.codehaus\.commons|org\.apache\.spark\.sql\.execution|org\.apache\.spark\.sql\.(Dataset|SparkSession|classic)|org\.antlr)"
        ),
    ),
    (
        "driver: Py4J, scheduler, serialization",
        re.compile(
            r"^(py4j|org\.apache\.spark\.scheduler|org\.apache\.spark\.(rpc|util\.ClosureCleaner)|java\.io\.Object|org\.apache\.xbean)"
        ),
    ),
]
OTHER = "other"


@dataclass
class Sample:
    at: datetime
    frames: list[str]

    @property
    def kind(self) -> str:
        for frame in self.frames:
            for name, pattern in KINDS:
                if pattern.search(frame):
                    return name
        return OTHER


@dataclass
class Window:
    """One window's profile: JIT and GC CPU seconds, and the execution samples' kinds and methods."""

    seconds: float
    jit_s: float = 0.0
    gc_s: float = 0.0
    samples: int = 0
    kinds: Counter = field(default_factory=Counter)
    methods: Counter = field(default_factory=Counter)


def _print(recording: Path, events: str, depth: int = 64) -> str:
    return subprocess.run(
        ["jfr", "print", "--events", events, "--stack-depth", str(depth), str(recording)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def _start(recording: Path, wait_s: float = 120.0) -> datetime:
    """The recording's start; waits for a JVM that is still writing it as it exits."""
    deadline = time.monotonic() + wait_s
    while True:
        summary = subprocess.run(["jfr", "summary", str(recording)], capture_output=True, text=True)
        found = re.search(r"Start: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", summary.stdout)
        if found:
            return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        if time.monotonic() > deadline:
            raise SystemExit(f"{recording}: not a complete recording: {summary.stderr.strip()[:200]}")
        time.sleep(2)


def _times(text: str, start: datetime) -> list[datetime]:
    """The events' start times (``jfr print`` gives the time of day, in the machine's zone: UTC here)."""
    out = []
    for clock in re.findall(r"startTime = (\d\d:\d\d:\d\d\.\d+)", text):
        t = datetime.strptime(f"{start:%Y-%m-%d} {clock}", "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
        out.append(t + timedelta(days=1) if t < start - timedelta(minutes=1) else t)
    return out


def _seconds(value: str) -> float:
    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    words = value.split()
    if len(words) == 2 and words[1] in scale:
        return float(words[0]) * scale[words[1]]
    parts = re.findall(r"([\d.]+) (h|m|s)", value)  # "2 m 38 s"
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


def read(recording: Path) -> tuple[list[Sample], list[tuple[datetime, float]], list[tuple[datetime, float]]]:
    """The execution samples, the JIT's cumulative compile time over time, and each GC's CPU."""
    start = _start(recording)
    text = _print(recording, "jdk.ExecutionSample")
    samples = []
    blocks = text.split("jdk.ExecutionSample {")[1:]
    for block, at in zip(blocks, _times(text, start), strict=True):
        stack = block.split("stackTrace = [", 1)[1].split("\n  ]", 1)[0]
        frames = [re.sub(r"\(.*", "", line.strip()) for line in stack.strip().splitlines()]
        samples.append(Sample(at, [f for f in frames if f and f != "..."]))
    text = _print(recording, "jdk.CompilerStatistics", 1)
    spent = [_seconds(v.strip()) for v in re.findall(r"totalTimeSpent = (.+)", text)]
    jit = list(zip(_times(text, start), spent, strict=True))
    text = _print(recording, "jdk.GCCPUTime", 1)
    cpu = [_seconds(u) + _seconds(s) for u, s in re.findall(r"userTime = (.+)\n\s*systemTime = (.+)", text)]
    gc = list(zip(_times(text, start), cpu, strict=True))
    return samples, jit, gc


def window(recording_data, spans: list[tuple[float, float]]) -> Window:
    """The profile of the spans (epoch seconds: start, end) together."""
    samples, jit, gc = recording_data
    out = Window(sum(end - begin for begin, end in spans))
    for begin_s, end_s in spans:
        begin, end = (datetime.fromtimestamp(x, UTC) for x in (begin_s, end_s))
        before = [s for t, s in jit if t <= begin]
        upto = [s for t, s in jit if t <= end]
        out.jit_s += (upto[-1] if upto else 0.0) - (before[-1] if before else 0.0)
        out.gc_s += sum(c for t, c in gc if begin <= t <= end)
        for s in samples:
            if begin <= s.at <= end and s.frames:
                out.samples += 1
                out.kinds[s.kind] += 1
                out.methods[s.frames[0]] += 1
    return out


def table(windows: dict[str, Window], top: int = 8) -> str:
    """A markdown table: per window, JIT and GC CPU seconds, then the samples' kinds (share of the
    window's samples), then the hottest methods of each."""
    names = list(windows)
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines.append("| window, s | " + " | ".join(f"{w.seconds:,.1f}" for w in windows.values()) + " |")
    lines.append("| JIT compiler CPU, s | " + " | ".join(f"{w.jit_s:,.1f}" for w in windows.values()) + " |")
    lines.append("| GC CPU, s | " + " | ".join(f"{w.gc_s:,.1f}" for w in windows.values()) + " |")
    lines.append(
        "| Java execution samples | " + " | ".join(f"{w.samples:,}" for w in windows.values()) + " |"
    )
    kinds = [k for k, _ in sum((w.kinds for w in windows.values()), Counter()).most_common()]
    for kind in kinds:
        cells = [f"{100 * w.kinds[kind] / w.samples:.0f} %" if w.samples else "" for w in windows.values()]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    for name, w in windows.items():
        text += f"\n\nhottest methods, {name} (share of its samples):\n"
        text += "\n".join(
            f"  {100 * n / w.samples:4.1f} %  {method}" for method, n in w.methods.most_common(top)
        )
    return text


def main() -> None:
    recording = Path(sys.argv[1])
    data = read(recording)
    samples = data[0]
    span = (samples[0].at.timestamp(), samples[-1].at.timestamp())
    print(table({"whole recording": window(data, [span])}, top=25))


if __name__ == "__main__":
    main()
