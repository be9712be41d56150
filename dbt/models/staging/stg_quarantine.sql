select run_id, run_time, job, source, line, raw_hex, reason
from {{ source('lake', 'quarantine') }}
