-- Per day, pipeline, suite and expectation: how many runs passed and failed, and how many keys were
-- offending in the day's last run (what was still wrong at the end of the day).
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
group by run_date, pipeline, suite, check_name, expectation
