-- one row per customer: the latest consents, with the e-mail the join found (null until the account exists)
select
    cast(key as string) as customer_id,
    retargeter1,
    retargeter2,
    contactMailAddress as contact_mail_address
from {{ source('lake', 'consents_with_mail') }}
