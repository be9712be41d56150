-- What the retargeters' opt-out connector sends: one row per customer and retargeter whose consent is
-- false, with the customer's contact e-mail.
with consents as (
    select
        customer_id,
        contact_mail_address,
        stack(2, 'retargeter1', retargeter1, 'retargeter2', retargeter2) as (retargeter, consent)
    from {{ ref('stg_consents') }}
)

select customer_id, retargeter, contact_mail_address
from consents
where consent = false
