select
    cast(key as string) as product_id,
    title,
    price,
    merchant_id,
    merchant as merchant_name,
    merchant_city
from {{ source('lake', 'display_products') }}
