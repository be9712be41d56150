"""The product's local services on this machine, one verb set for each: ``lake kafka | registry | s3 |
connect start | stop | status | log`` (the embedded broker, the embedded Schema Registry, the
embedded S3-compatible store for a lake on object storage tried on one machine, the Spark Connect
server that quick commands use); ``lake up`` / ``lake down``: the broker, the registry and the
Connect server together. Each is a :class:`spark_jobs.seams.processes.Service`."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from importlib import import_module

from spark_jobs.cli.common import Parser
from spark_jobs.errors import UserError


@dataclass(frozen=True)
class _Entry:
    """A service as the command line names it (its class is imported when a command runs)."""

    name: str
    module: str
    cls: str
    help: str
    port: str  # the help text's default port
    stays: str  # what a stop leaves
    in_work: bool = False  # it serves the lake root's work folder (this machine's), not the root

    def service(self, args):
        from spark_jobs.seams.storage import resolve_root, work_folder

        cls = getattr(import_module(f"spark_jobs.seams.{self.module}"), self.cls)
        return cls(work_folder(args.root) if self.in_work else resolve_root(args.root))


SERVICES = (
    _Entry(
        "kafka",
        "broker",
        "Broker",
        "the embedded single-node Kafka broker (KRaft; data and log under <root>/_kafka)",
        "$LAKE_KAFKA_PORT or 9092",
        "the data stays under <root>/_kafka",
    ),
    _Entry(
        "registry",
        "embedded_registry",
        "Registry",
        "the embedded Schema Registry (Confluent-compatible API; schemas kept under <root>/_registry)",
        "$LAKE_REGISTRY_PORT or 8081",
        "the schemas stay under <root>/_registry",
    ),
    _Entry(
        "s3",
        "embedded_s3",
        "S3Store",
        "the embedded S3-compatible store (S3Proxy, objects kept under <work>/_s3/data)",
        "$LAKE_S3_PORT or 9000",
        "the objects stay under <work>/_s3/data",
        in_work=True,
    ),
    _Entry(
        "connect",
        "connect",
        "ConnectServer",
        "the Spark Connect server of the lake root (quick 'lake show')",
        "$LAKE_CONNECT_PORT or 15002",
        "nothing of the lake is in it",
    ),
)
_BY_NAME = {e.name: e for e in SERVICES}
UP = ("kafka", "registry", "connect")  # lake up starts these, lake down stops them in reverse


def register(sub, common) -> None:
    for entry in SERVICES:
        p = sub.add_parser(entry.name, parents=[common], help=entry.help)
        verbs = p.add_subparsers(dest=f"{entry.name}_command", metavar="ACTION", parser_class=Parser)
        start = verbs.add_parser("start", parents=[common], help="start it; returns once it answers")
        start.add_argument(
            "--port", f"--{entry.name}-port", dest="port", type=int, default=None,
            help=f"its loopback port (default {entry.port})",
        )  # fmt: skip
        _START_OPTIONS.get(entry.name, lambda _: None)(start)
        start.set_defaults(run=cmd_start, service=entry.name)
        stop = verbs.add_parser("stop", parents=[common], help=f"stop it ({entry.stays})")
        stop.set_defaults(run=cmd_stop, service=entry.name)
        status = verbs.add_parser("status", parents=[common], help="is it running, and where")
        status.add_argument("--json", action="store_true", help="the status as one JSON object")
        status.set_defaults(run=cmd_status, service=entry.name)
        log = verbs.add_parser("log", parents=[common], help="the end of its log")
        log.add_argument("--lines", type=int, default=40, help="how many lines (default 40)")
        log.set_defaults(run=cmd_log, service=entry.name)

    up = sub.add_parser(
        "up",
        parents=[common],
        help="start the embedded Kafka broker, the embedded Schema Registry and the Spark Connect server "
        "(quick 'lake show')",
    )
    for name in UP:
        flags = ("--port", "--kafka-port") if name == "kafka" else (f"--{name}-port",)
        up.add_argument(*flags, dest=f"{name}_port", type=int, default=None, help=f"the {name} port")
    up.set_defaults(run=cmd_up)
    down = sub.add_parser(
        "down",
        parents=[common],
        help="stop the Spark Connect server, the embedded Schema Registry and the embedded broker",
    )
    down.set_defaults(run=cmd_down)


def _kafka_options(parser) -> None:
    parser.add_argument(
        "--sasl-user",
        action="append",
        default=[],
        metavar="USER:PASSWORD",
        help="also open a SASL_PLAINTEXT listener (PLAIN) with this user (repeatable)",
    )
    parser.add_argument("--sasl-port", type=int, help="the SASL listener's port (default: port + 2)")


def _s3_options(parser) -> None:
    parser.add_argument(
        "--bucket", action="append", default=[], help="a bucket to create unless it exists (repeatable)"
    )


_START_OPTIONS = {"kafka": _kafka_options, "s3": _s3_options}


def _options(name: str, args) -> dict:
    """A service's own start options from the command line."""
    if name == "kafka":
        users = {}
        for item in args.sasl_user:
            user, sep, password = item.partition(":")
            if not sep or not user or not password:
                raise UserError(f"--sasl-user must be USER:PASSWORD, got {item!r}")
            users[user] = password
        return {"sasl_port": args.sasl_port, "sasl_users": users}
    if name == "s3":
        from spark_jobs.seams.storage import bucket_of

        root_bucket = bucket_of(args.root)  # an s3a:// root's bucket is made with the store
        return {"buckets": tuple(dict.fromkeys([root_bucket, *args.bucket] if root_bucket else args.bucket))}
    return {}


def _log(message: str) -> None:
    print(message, file=sys.stderr)


def cmd_start(args) -> int:
    service = _BY_NAME[args.service].service(args)
    print(service.start(args.port, log=_log, **_options(args.service, args)).text())
    return 0


def cmd_stop(args) -> int:
    _stop(_BY_NAME[args.service].service(args))
    return 0


def _stop(service) -> None:
    print(f"{service.title}: stopped" if service.stop(log=_log) else f"{service.title}: was not running")


def cmd_status(args) -> int:
    state = _BY_NAME[args.service].service(args).status()
    print(json.dumps(state.as_dict()) if args.json else state.text())
    return 0


def cmd_log(args) -> int:
    service = _BY_NAME[args.service].service(args)
    if args.lines < 1:
        raise UserError("--lines must be at least 1")
    text = service.log_tail(args.lines)
    print(text if text else f"{service.title}: no log yet at {service.log_file}")
    return 0


def cmd_up(args) -> int:
    for name in UP:
        service = _BY_NAME[name].service(args)
        flag = "--port" if name == "kafka" else f"--{name}-port"
        print(service.start(getattr(args, f"{name}_port"), log=_log, flag=flag).text())
    return 0


def cmd_down(args) -> int:
    for name in reversed(UP):
        _stop(_BY_NAME[name].service(args))
    return 0
