select product_id, title, price, merchant_id, merchant_name, merchant_city
from {{ ref('stg_display_products') }}
