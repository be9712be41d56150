-- one row per customer account (the lookup already holds the latest value per key)
select
    cast(key as string) as customer_id,
    get_json_object(cast(value as string), '$.contactMailAddress') as contact_mail_address,
    `partition` as topic_partition,
    `offset` as topic_offset,
    `timestamp` as updated_at
from {{ source('lake', 'lookup_accounts') }}
