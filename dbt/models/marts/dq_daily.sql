-- Per day, pipeline, suite and expectation: how many runs passed and failed, and how many keys were
-- offending in the day's last run (what was still wrong at the end of the day).
--
-- Incremental: quality_runs only grows, so a build reads the runs from the last day the mart holds
-- on, recomputes those days whole and merges them in by the mart's key (a Delta MERGE); earlier days
-- stay as they are. `lake dbt build --full-refresh` rebuilds it from every run.
{{
  config(
    materialized='incremental',
    incremental_strategy='merge',
    unique_key=['run_date', 'pipeline', 'suite', 'check_name', 'expectation'],
  )
}}
select
    run_date,
    pipeline,
    suite,
    check_name,
    expectation,
    count_if(success) as passes,
    count_if(not success) as failures,
    max_by(offending_total, run_time) as offending_keys,
    max(run_time) as last_run_time
from {{ ref('stg_quality_runs') }}
{% if is_incremental() %}
where run_date >= (select max(run_date) from {{ this }})
{% endif %}
group by run_date, pipeline, suite, check_name, expectation
