select
    cast(key as string) as person_id,
    * except (key)
from {{ source('lake', 'people_with_addresses') }}
