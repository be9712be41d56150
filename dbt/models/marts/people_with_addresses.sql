-- persons with their enriched address list, and how many of its addresses are known
select
    p.person_id,
    p.name,
    p.addresses,
    size(p.addresses) as address_count,
    size(filter(p.addresses, a -> a.matched)) as known_address_count
from {{ ref('stg_people_with_addresses') }} as p
