"""``lake kafka start|stop|status``: the embedded single-node KRaft broker."""

from __future__ import annotations

import json
import os
import sys

from spark_jobs.cli.common import Parser
from spark_jobs.errors import UserError


def register(sub, common) -> None:
    k = sub.add_parser("kafka", parents=[common], help="the embedded single-node Kafka broker (KRaft)")
    ksub = k.add_subparsers(dest="kafka_command", metavar="ACTION", parser_class=Parser)
    ks = ksub.add_parser(
        "start",
        parents=[common],
        help="start the broker (data and log under <root>/_kafka); returns once it answers",
    )
    ks.add_argument("--port", type=int, default=None, help="loopback port (default $LAKE_KAFKA_PORT or 9092)")
    ks.add_argument(
        "--sasl-user",
        action="append",
        default=[],
        metavar="USER:PASSWORD",
        help="also open a SASL_PLAINTEXT listener (PLAIN) with this user (repeatable)",
    )
    ks.add_argument("--sasl-port", type=int, help="the SASL listener's port (default: port + 2)")
    ks.set_defaults(run=cmd_kafka_start)
    kt = ksub.add_parser("stop", parents=[common], help="stop the broker (controlled shutdown)")
    kt.set_defaults(run=cmd_kafka_stop)
    kst = ksub.add_parser("status", parents=[common], help="is the broker running, and where")
    kst.add_argument("--json", action="store_true", help='{"running": ..., "bootstrap_servers": ...}')
    kst.set_defaults(run=cmd_kafka_status)


def cmd_kafka_start(args) -> int:
    from spark_jobs.seams import broker
    from spark_jobs.seams.storage import resolve_root

    users = {}
    for item in args.sasl_user:
        user, sep, password = item.partition(":")
        if not sep or not user or not password:
            raise UserError(f"--sasl-user must be USER:PASSWORD, got {item!r}")
        users[user] = password
    state = broker.start(
        resolve_root(args.root),
        broker_port(args),
        args.sasl_port,
        users,
        log=lambda m: print(m, file=sys.stderr),
    )
    print(state.text())
    return 0


def broker_port(args) -> int:
    """The broker's port: --port, else $LAKE_KAFKA_PORT, else 9092."""
    from spark_jobs.seams import broker

    return args.port or int(os.environ.get("LAKE_KAFKA_PORT", broker.DEFAULT_PORT))


def cmd_kafka_stop(args) -> int:
    from spark_jobs.seams import broker
    from spark_jobs.seams.storage import resolve_root

    stopped = broker.stop(resolve_root(args.root), log=lambda m: print(m, file=sys.stderr))
    print("embedded Kafka broker: stopped" if stopped else "embedded Kafka broker: was not running")
    return 0


def cmd_kafka_status(args) -> int:

    from spark_jobs.seams import broker
    from spark_jobs.seams.storage import resolve_root

    state = broker.status(resolve_root(args.root))
    print(json.dumps(state.as_dict()) if args.json else state.text())
    return 0
