#!/usr/bin/env bash
# The bundled pipelines as Airflow runs them, each in turn: `infra/airflow-pipeline.sh [PIPELINE...]`
# (default: consents marketplace people; make pipeline runs the three, make demo the foreign-key and
# list pipelines, marketplace and people, after telling all three stories on the console):
#   1. `airflow dags test <pipeline>_pipeline`: backfill -> quality suites -> gate -> start the
#      joins -> wait until they have caught up -> dbt build of the pipeline's marts
#   2. `lake status`: the continuous joins running, caught up, and up to which offsets they read
#   3. `airflow dags test <pipeline>_streams`: the scheduled health check
#   4. `airflow dags test <pipeline>_streams --conf '{"action": "stop"}'`: stop the joins
#      (KEEP_JOINS=1 leaves them running; stop them later with `lake stop JOIN` and `lake ingest --stop`)
# Airflow's full output goes to $AIRFLOW_LOG (default .airflow/pipeline.log); this prints the task
# lines. Uses LAKE_ROOT / --root like every lake command (default ./lakehouse).
set -euo pipefail
cd "$(dirname "$0")/.."
LAKE=.venv/bin/lake
HOME_DIR="${LAKE_AIRFLOW_HOME:-$PWD/.airflow}"
LOG="${AIRFLOW_LOG:-$HOME_DIR/pipeline.log}"
mkdir -p "$HOME_DIR"
: >"$LOG"

airflow() {  # run `lake airflow ARGS`, keep its log, print the lines a person reads
  local status=0
  "$LAKE" airflow "$@" >>"$LOG" 2>&1 || status=$?
  return $status
}

dag_test() {
  local dag=$1; shift
  echo "-- airflow dags test $dag $*"
  local from; from=$(wc -l <"$LOG")
  if airflow dags test "$dag" "$@"; then status=0; else status=$?; fi
  tail -n +"$((from + 1))" "$LOG" | grep -E "\[DAG TEST\] (starting|end) task|PASS |FAIL |quality gate|backfill [a-z_]+ from|join [a-z_]+: |ingest of [a-z_]+: |healthy|problem\(s\)|report in the browser|DagRun Finished|Done\. PASS=|Completed successfully|Completed with" \
    | grep -Ev "(PASS|FAIL)  .*SparkSubmitHook|Done\. Returned" \
    | sed -E 's/^[0-9TZ:.-]+ \[[a-z ]+\] //; s/ +\[[A-Za-z_.]+\] loc=.*$//; s/ map_index=-1.*$//' | cut -c1-300
  return $status
}

PIPELINES=spark_jobs/demo/pipelines
declare -A FILES=([consents]=demo.yaml [marketplace]=marketplace.yaml [people]=people.yaml)
RUNS=("$@")
[[ ${#RUNS[@]} -gt 0 ]] || RUNS=(consents marketplace people)
for name in "${RUNS[@]}"; do
  [[ -n "${FILES[$name]:-}" ]] || { echo "unknown pipeline '$name' (known: ${!FILES[*]})" >&2; exit 2; }
done

echo "Airflow home $HOME_DIR (full log: $LOG)"
airflow db migrate
"$LAKE" demo --topics-only "${RUNS[@]}" >/dev/null   # left as they are when present

step=8
for name in "${RUNS[@]}"; do
  config=(--config "$PIPELINES/${FILES[$name]}")
  echo
  echo "== $step. the $name pipeline DAG: backfill -> quality suites -> gate -> continuous joins -> dbt build"
  dag_test "${name}_pipeline" || { echo "the $name pipeline DAG failed; see $LOG"; exit 1; }
  echo "waiting for the continuous joins of $name to catch up ..."
  for _ in $(seq 1 90); do
    if "$LAKE" "${config[@]}" health --max-behind 0 >/dev/null 2>&1; then break; fi
    sleep 2
  done
  "$LAKE" "${config[@]}" status
  echo
  echo "-- the $name streams DAG: health check (what the schedule runs every 15 minutes)"
  dag_test "${name}_streams" || { echo "the $name health check failed; see $LOG"; exit 1; }
  if [[ "${KEEP_JOINS:-0}" != 1 ]]; then
    echo "-- the $name streams DAG with action=stop (maintenance)"
    dag_test "${name}_streams" --conf '{"action": "stop"}'
  fi
  step=$((step + 1))
done
if [[ "${KEEP_JOINS:-0}" == 1 ]]; then
  echo "the joins keep running (KEEP_JOINS=1): stop them with '$LAKE stop JOIN' and '$LAKE ingest --stop', or the streams DAGs"
fi
