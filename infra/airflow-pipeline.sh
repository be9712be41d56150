#!/usr/bin/env bash
# The bundled pipelines as Airflow runs them: `infra/airflow-pipeline.sh [PIPELINE...]` (default:
# consents marketplace people; make pipeline runs the three, make demo the foreign-key and list
# pipelines, marketplace and people, after telling all three stories on the console). The pipelines
# run side by side, as Airflow's scheduler runs the DAGs of different pipelines; each one's story is
# printed, in order, once it is done. Per pipeline:
#   1. `airflow dags test <pipeline>_pipeline`: backfill -> quality suites -> gate -> start the
#      joins -> wait until they have caught up -> dbt build of the pipeline's marts
#   2. `lake status`: the continuous joins running, caught up, and up to which offsets they read
#   3. `airflow dags test <pipeline>_streams`: the scheduled health check
#   4. `airflow dags test <pipeline>_streams --conf '{"action": "stop"}'`: stop the joins
#      (KEEP_JOINS=1 leaves them running; stop them later with `lake stop JOIN` and `lake ingest --stop`)
# Airflow's full output goes to .airflow/<pipeline>.log (under $LAKE_AIRFLOW_HOME when set); this
# prints the task lines. Uses LAKE_ROOT / --root like every lake command (default ./lakehouse).
set -euo pipefail
cd "$(dirname "$0")/.."
LAKE=.venv/bin/lake
HOME_DIR="${LAKE_AIRFLOW_HOME:-$PWD/.airflow}"
mkdir -p "$HOME_DIR"

declare -A FILES=([consents]=demo.yaml [marketplace]=marketplace.yaml [people]=people.yaml)
RUNS=("$@")
[[ ${#RUNS[@]} -gt 0 ]] || RUNS=(consents marketplace people)
for name in "${RUNS[@]}"; do
  [[ -n "${FILES[$name]:-}" ]] || { echo "unknown pipeline '$name' (known: ${!FILES[*]})" >&2; exit 2; }
done

dag_test() {  # dag_test LOG DAG ARGS: `lake airflow dags test DAG ARGS`, its task lines printed
  local log=$1 dag=$2; shift 2
  echo "-- airflow dags test $dag $*"
  local from status=0; from=$(wc -l <"$log")
  "$LAKE" airflow dags test "$dag" "$@" >>"$log" 2>&1 || status=$?
  tail -n +"$((from + 1))" "$log" | grep -E "\[DAG TEST\] (starting|end) task|PASS |FAIL |quality gate|backfill [a-z_]+ from|join [a-z_]+: |ingest of [a-z_]+: |healthy|problem\(s\)|report in the browser|DagRun Finished|Done\. PASS=|Completed successfully|Completed with" \
    | grep -Ev "(PASS|FAIL)  .*SparkSubmitHook|Done\. Returned" \
    | sed -E 's/^[0-9TZ:.-]+ \[[a-z ]+\] //; s/ +\[[A-Za-z_.]+\] loc=.*$//; s/ map_index=-1.*$//' | cut -c1-300
  return $status
}

pipeline() {  # pipeline NAME STEP: one pipeline's DAG runs, told on stdout
  local name=$1 step=$2 log="$HOME_DIR/$name.log"
  local config=(--config "spark_jobs/demo/pipelines/${FILES[$name]}")
  : >"$log"
  echo
  echo "== $step. the $name pipeline DAG: backfill -> quality suites -> gate -> continuous joins -> dbt build"
  dag_test "$log" "${name}_pipeline" || { echo "the $name pipeline DAG failed; see $log"; return 1; }
  for _ in $(seq 1 90); do  # the DAG waited for them; a record produced since may still be on its way
    if "$LAKE" "${config[@]}" health --max-behind 0 >/dev/null 2>&1; then break; fi
    sleep 2
  done
  "$LAKE" "${config[@]}" status
  echo
  echo "-- the $name streams DAG: health check (what the schedule runs every 15 minutes)"
  dag_test "$log" "${name}_streams" || { echo "the $name health check failed; see $log"; return 1; }
  if [[ "${KEEP_JOINS:-0}" != 1 ]]; then
    echo "-- the $name streams DAG with action=stop (maintenance)"
    dag_test "$log" "${name}_streams" --conf '{"action": "stop"}'
  fi
}

echo
echo "Airflow home $HOME_DIR (logs: $HOME_DIR/<pipeline>.log)"
# the database, and every DAG and Asset written into it once, before DAG runs side by side would race
# to insert them (on a new database two `dags test` insert the same Asset: UNIQUE constraint failed)
{ "$LAKE" airflow db migrate && "$LAKE" airflow dags reserialize; } >"$HOME_DIR/setup.log" 2>&1 \
  || { cat "$HOME_DIR/setup.log"; exit 1; }
"$LAKE" demo --topics-only "${RUNS[@]}" >/dev/null   # left as they are when present

echo "${RUNS[*]}: their DAGs run side by side, as the scheduler runs them; each one's story follows"
echo "once it is done (a few minutes; 'tail -f $HOME_DIR/<pipeline>.log' shows Airflow at work)"
pids=()
step=8
for name in "${RUNS[@]}"; do
  pipeline "$name" "$step" >"$HOME_DIR/$name.out" 2>&1 &
  pids+=($!)
  step=$((step + 1))
done
trap 'kill "${pids[@]}" 2>/dev/null || true' INT TERM
failed=0
for i in "${!RUNS[@]}"; do
  status=0
  wait "${pids[$i]}" || status=$?
  cat "$HOME_DIR/${RUNS[$i]}.out"
  [[ $status == 0 ]] || failed=1
done
[[ $failed == 0 ]] || exit 1
if [[ "${KEEP_JOINS:-0}" == 1 ]]; then
  echo "the joins keep running (KEEP_JOINS=1): stop them with '$LAKE stop JOIN' and '$LAKE ingest --stop', or the streams DAGs"
fi
