"""``lake up`` / ``lake down``: the product's services on this machine, the embedded broker, the
embedded Schema Registry and the Spark Connect server that quick commands use; ``lake registry
start|stop|status`` and ``lake connect start|stop|status`` for one of them alone (the broker alone:
``lake kafka``); ``lake s3 start|stop|status``: the embedded S3-compatible store, for a lake on
object storage tried on one machine."""

from __future__ import annotations

import json
import os
import sys

from spark_jobs.cli.common import Parser
from spark_jobs.cli.kafka import broker_port, cmd_kafka_stop


def register(sub, common) -> None:
    up = sub.add_parser(
        "up",
        parents=[common],
        help="start the embedded Kafka broker, the embedded Schema Registry and the Spark Connect server "
        "(quick 'lake show')",
    )
    up.add_argument(
        "--port", type=int, default=None, help="the broker's port (default $LAKE_KAFKA_PORT or 9092)"
    )
    up.add_argument(
        "--registry-port",
        type=int,
        default=None,
        help="the registry's port (default $LAKE_REGISTRY_PORT or 8081)",
    )
    up.add_argument(
        "--connect-port", type=int, default=None, help="the Spark Connect server's port (default 15002)"
    )
    up.set_defaults(run=cmd_up)
    down = sub.add_parser(
        "down",
        parents=[common],
        help="stop the Spark Connect server, the embedded Schema Registry and the embedded broker",
    )
    down.set_defaults(run=cmd_down)

    r = sub.add_parser(
        "registry",
        parents=[common],
        help="the embedded Schema Registry (Confluent-compatible API; schemas kept under <root>/_registry)",
    )
    rsub = r.add_subparsers(dest="registry_command", metavar="ACTION", parser_class=Parser)
    rs = rsub.add_parser("start", parents=[common], help="start it; returns once it answers")
    rs.add_argument(
        "--registry-port",
        "--port",
        type=int,
        default=None,
        help="its port (default $LAKE_REGISTRY_PORT or 8081)",
    )
    rs.set_defaults(run=cmd_registry_start)
    rt = rsub.add_parser("stop", parents=[common], help="stop it (the schemas stay under <root>/_registry)")
    rt.set_defaults(run=cmd_registry_stop)
    rst = rsub.add_parser("status", parents=[common], help="is it running, and its URL")
    rst.add_argument("--json", action="store_true", help='{"running": ..., "url": ...}')
    rst.set_defaults(run=cmd_registry_status)

    s3 = sub.add_parser(
        "s3",
        parents=[common],
        help="the embedded S3-compatible store (S3Proxy, objects kept under <work>/_s3/data)",
    )
    s3sub = s3.add_subparsers(dest="s3_command", metavar="ACTION", parser_class=Parser)
    s3s = s3sub.add_parser("start", parents=[common], help="start it; returns once it answers")
    s3s.add_argument(
        "--s3-port", "--port", type=int, default=None, help="its port (default $LAKE_S3_PORT or 9000)"
    )
    s3s.add_argument(
        "--bucket", action="append", default=[], help="a bucket to create unless it exists (repeatable)"
    )
    s3s.set_defaults(run=cmd_s3_start)
    s3t = s3sub.add_parser("stop", parents=[common], help="stop it (the objects stay under <work>/_s3/data)")
    s3t.set_defaults(run=cmd_s3_stop)
    s3st = s3sub.add_parser("status", parents=[common], help="is it running, its endpoint and access key")
    s3st.add_argument(
        "--json", action="store_true", help='{"running": ..., "endpoint": ...} (never the secret)'
    )
    s3st.set_defaults(run=cmd_s3_status)

    c = sub.add_parser("connect", parents=[common], help="the Spark Connect server of the lake root alone")
    csub = c.add_subparsers(dest="connect_command", metavar="ACTION", parser_class=Parser)
    cs = csub.add_parser("start", parents=[common], help="start it; returns once it accepts connections")
    cs.add_argument("--connect-port", type=int, default=None, help="its port (default 15002)")
    cs.set_defaults(run=cmd_connect_start)
    ct = csub.add_parser("stop", parents=[common], help="stop it")
    ct.set_defaults(run=cmd_connect_stop)
    cst = csub.add_parser("status", parents=[common], help="is it running, and where")
    cst.add_argument("--json", action="store_true", help='{"running": ..., "url": ...}')
    cst.set_defaults(run=cmd_connect_status)


def _log(message: str) -> None:
    print(message, file=sys.stderr)


def _root(args):
    from spark_jobs.seams.storage import resolve_root

    return resolve_root(args.root)


def _connect_port(args) -> int:
    from spark_jobs.seams import connect

    return args.connect_port or int(os.environ.get("LAKE_CONNECT_PORT", connect.DEFAULT_PORT))


def cmd_up(args) -> int:
    from spark_jobs.seams import broker

    print(broker.start(_root(args), broker_port(args), log=_log).text())
    cmd_registry_start(args)
    return cmd_connect_start(args)


def cmd_down(args) -> int:
    cmd_connect_stop(args)
    cmd_registry_stop(args)
    return cmd_kafka_stop(args)


def _registry_port(args) -> int:
    from spark_jobs.seams import embedded_registry

    return args.registry_port or int(os.environ.get("LAKE_REGISTRY_PORT", embedded_registry.DEFAULT_PORT))


def cmd_registry_start(args) -> int:
    from spark_jobs.seams import embedded_registry

    print(embedded_registry.start(_root(args), _registry_port(args), log=_log).text())
    return 0


def cmd_registry_stop(args) -> int:
    from spark_jobs.seams import embedded_registry

    stopped = embedded_registry.stop(_root(args), log=_log)
    print("embedded Schema Registry: stopped" if stopped else "embedded Schema Registry: was not running")
    return 0


def cmd_registry_status(args) -> int:
    from spark_jobs.seams import embedded_registry

    state = embedded_registry.status(_root(args))
    print(json.dumps(state.as_dict()) if args.json else state.text())
    return 0


def _work(args):
    from spark_jobs.seams.storage import work_folder

    return work_folder(args.root)


def cmd_s3_start(args) -> int:
    from spark_jobs.seams import embedded_s3
    from spark_jobs.seams.storage import bucket_of

    port = args.s3_port or int(os.environ.get("LAKE_S3_PORT", embedded_s3.DEFAULT_PORT))
    root_bucket = bucket_of(args.root)  # an s3a:// root's bucket is made with the store
    buckets = tuple(dict.fromkeys([root_bucket, *args.bucket] if root_bucket else args.bucket))
    print(embedded_s3.start(_work(args), port, buckets, log=_log).text())
    return 0


def cmd_s3_stop(args) -> int:
    from spark_jobs.seams import embedded_s3

    stopped = embedded_s3.stop(_work(args), log=_log)
    print("embedded S3 store: stopped" if stopped else "embedded S3 store: was not running")
    return 0


def cmd_s3_status(args) -> int:
    from spark_jobs.seams import embedded_s3

    state = embedded_s3.status(_work(args))
    print(json.dumps(state.as_dict()) if args.json else state.text())
    return 0


def cmd_connect_start(args) -> int:
    from spark_jobs.seams import connect

    print(connect.start(_root(args), _connect_port(args), log=_log).text())
    return 0


def cmd_connect_stop(args) -> int:
    from spark_jobs.seams import connect

    stopped = connect.stop(_root(args), log=_log)
    print("Spark Connect server: stopped" if stopped else "Spark Connect server: was not running")
    return 0


def cmd_connect_status(args) -> int:
    from spark_jobs.seams import connect

    state = connect.status(_root(args))
    print(json.dumps(state.as_dict()) if args.json else state.text())
    return 0
