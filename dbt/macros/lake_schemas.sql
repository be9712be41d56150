{# A model's +schema is used as it is (marts, global_temp), not prefixed with the target's schema. #}
{% macro generate_schema_name(custom_schema_name, node) -%}
  {{ custom_schema_name if custom_schema_name is not none else target.schema }}
{%- endmacro %}

{#
  Staging views live in Spark's global_temp schema: they read the lake's tables, which are global
  temporary views (a catalog view may not reference a temporary one, so a staging view cannot be a
  catalog view either). Every other view is dbt-spark's own.
#}
{% macro spark__create_view_as(relation, sql) -%}
  {%- if relation.schema == 'global_temp' -%}
  create or replace global temporary view {{ relation.identifier }} as
    {{ sql }}
  {%- else -%}
  {{ spark__create_catalog_view_as(relation, sql) }}
  {%- endif -%}
{%- endmacro %}

{% macro spark__create_catalog_view_as(relation, sql) -%}
  create or replace view {{ relation }} as
    {{ sql }}
{%- endmacro %}

{# global_temp exists in every session and cannot be created #}
{% macro spark__create_schema(relation) -%}
  {%- if relation.schema != 'global_temp' -%}
  {%- call statement('create_schema') -%}
    create schema if not exists {{ relation }}
  {% endcall %}
  {%- endif -%}
{% endmacro %}
