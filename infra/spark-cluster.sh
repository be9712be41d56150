#!/usr/bin/env bash
# A Spark standalone cluster on this machine, from the pyspark installation in .venv: one master and
# two workers, each its own JVM, as on a real cluster (docs/airflow.md, "Running on a Spark cluster").
#
#   infra/spark-cluster.sh start    # returns once both workers have registered; prints the master URL
#   infra/spark-cluster.sh status   # the master's view: workers, running and completed applications
#   infra/spark-cluster.sh stop
#
# Settings (environment): SPARK_CLUSTER_DIR (default .spark-cluster: pids, logs, work dirs),
# SPARK_MASTER_PORT (7077), SPARK_MASTER_WEBUI_PORT (8090; workers take the next two ports),
# SPARK_WORKER_CORES (2 each), SPARK_WORKER_MEMORY (4g each). Each worker has its own work and temp
# folders (<dir>/workerN/). SPARK_CLUSTER_HIDE: folders (colon-separated) the workers must not see, as
# machines that share no disk with the driver: each worker then runs in a mount namespace of its own
# (unshare) with an empty file system mounted over each of them.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="$PWD/.venv/bin"
DIR="$(realpath -m "${SPARK_CLUSTER_DIR:-.spark-cluster}")"
HOST=127.0.0.1
PORT="${SPARK_MASTER_PORT:-7077}"
UI="${SPARK_MASTER_WEBUI_PORT:-8090}"
CORES="${SPARK_WORKER_CORES:-2}"
MEMORY="${SPARK_WORKER_MEMORY:-4g}"
MASTER="spark://$HOST:$PORT"

die() { echo "spark-cluster: $*" >&2; exit 1; }

alive() { [[ -f "$DIR/$1.pid" ]] && kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null; }

launch() {  # name, class, args...
  local name=$1; shift
  if alive "$name"; then echo "$name already running (pid $(cat "$DIR/$name.pid"))"; return; fi
  local run=("$SPARK_HOME/bin/spark-class" "$@") dirs=()
  if [[ $name == worker* ]]; then
    dirs=(SPARK_LOCAL_DIRS="$DIR/$name/local" TMPDIR="$DIR/$name/tmp")
    # the executors a worker starts (its children) hold the joins' RocksDB state: on jemalloc, as the
    # product's own driver JVMs are (spark_jobs/seams/jvm.py, ALLOCATOR); on a cluster of your own, the
    # same line in each worker's conf/spark-env.sh. As allocator_env does: not with LAKE_MALLOC=glibc,
    # and a preload of the caller's own kept after it
    if [[ ${LAKE_MALLOC:-} != glibc && -f build/native/libjemalloc.so.2 ]]; then
      dirs+=(LD_PRELOAD="$PWD/build/native/libjemalloc.so.2${LD_PRELOAD:+ $LD_PRELOAD}")
    fi
    if [[ -n "${SPARK_CLUSTER_HIDE:-}" ]]; then
      # its own mount namespace (in a user namespace of its own, so no privilege is needed), where
      # each hidden folder is an empty file system; unshare and sh exec, so the pid stays the JVM's
      run=(unshare --user --map-root-user --mount --propagation private sh -c '
        IFS=:; for folder in $SPARK_CLUSTER_HIDE; do mount -t tmpfs hidden "$folder" || exit 1; done
        unset IFS; exec "$@"' sh "${run[@]}")
    fi
  fi
  # spark-class execs the JVM, so $! is the JVM's pid; setsid: it outlives this shell
  env "${dirs[@]}" setsid "${run[@]}" >"$DIR/$name.log" 2>&1 < /dev/null &
  echo $! >"$DIR/$name.pid"
  echo "$name started (pid $!), log $DIR/$name.log"
}

master_json() {
  "$BIN/python" - "$UI" <<'EOF'
import json, sys, urllib.request
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/json/", timeout=2) as r:
        print(json.dumps(json.load(r)))
except OSError:
    sys.exit(1)
EOF
}

alive_workers() {
  master_json 2>/dev/null | "$BIN/python" -c 'import json,sys; print(json.load(sys.stdin).get("aliveworkers", 0))' \
    2>/dev/null || echo 0
}

start() {
  [[ -x "$BIN/python" ]] || die "no $BIN/python: run 'make setup' first"
  SPARK_HOME="$("$BIN/python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
  export SPARK_HOME
  command -v java >/dev/null || [[ -n "${JAVA_HOME:-}" ]] || die "no java: run 'make setup' first"
  mkdir -p "$DIR"
  export SPARK_LOCAL_IP=$HOST SPARK_NO_DAEMONIZE=1
  launch master org.apache.spark.deploy.master.Master --host $HOST --port "$PORT" --webui-port "$UI"
  for i in 1 2; do
    mkdir -p "$DIR/worker$i/local" "$DIR/worker$i/tmp"
    launch "worker$i" org.apache.spark.deploy.worker.Worker --host $HOST --cores "$CORES" \
      --memory "$MEMORY" --webui-port $((UI + i)) --work-dir "$DIR/worker$i" "$MASTER"
  done
  for _ in $(seq 1 120); do
    if [[ "$(alive_workers)" == 2 ]]; then
      echo "cluster up: $MASTER with 2 workers ($CORES cores, $MEMORY each); UI http://$HOST:$UI"
      echo "use it: export LAKE_SPARK_MASTER=$MASTER LAKE_SPARK_CORES_MAX=1"
      return
    fi
    for name in master worker1 worker2; do
      alive "$name" || die "$name exited; see $DIR/$name.log: $(tail -n 3 "$DIR/$name.log" | tr '\n' ' ')"
    done
    sleep 1
  done
  die "the workers did not register within 120 s; see $DIR/*.log"
}

stop() {
  for name in worker2 worker1 master; do
    if alive "$name"; then
      kill "$(cat "$DIR/$name.pid")"
      for _ in $(seq 1 30); do alive "$name" || break; sleep 0.5; done
      alive "$name" && kill -9 "$(cat "$DIR/$name.pid")"
      echo "$name stopped"
    fi
    rm -f "$DIR/$name.pid"
  done
}

status() {
  local json
  json="$(master_json)" || die "no master answering on http://$HOST:$UI (start it: infra/spark-cluster.sh start)"
  "$BIN/python" -c '
import json, sys
m = json.loads(sys.argv[1])
print("{url}: {status}, {aliveworkers} alive worker(s), {coresused}/{cores} cores used".format(**m))
for w in m["workers"]:
    print("  worker {host}:{port} {state} {coresused}/{cores} cores".format(**w))
for kind in ("activeapps", "completedapps"):
    for a in m[kind]:
        print("  {0} app {id} {name} {state}".format(kind[:-4], **a))
' "$json"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: infra/spark-cluster.sh start|stop|status" ;;
esac
