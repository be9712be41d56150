select
    run_id,
    run_time,
    cast(run_time as date) as run_date,
    pipeline,
    suite,
    suite_version,
    `check` as check_name,
    expectation,
    success,
    offending_total,
    offending_sample
from {{ source('lake', 'quality_runs') }}
