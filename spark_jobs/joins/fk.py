"""fk: a foreign-key table-table join, keyed by the left key (docs/joins.md, "Foreign-key, list and derive
joins")."""

from __future__ import annotations

from spark_jobs.joins.keyed import KeyedJob
from spark_jobs.joins.state_store import StateStoreJob


class FkJob(KeyedJob, StateStoreJob):
    """fk: the KIP-213 shape in Spark's state store (``lake.joins.FkJoin``, Java): the left side by its
    key, subscriptions routed to the foreign key, the right side and its subscribers by foreign key; a
    right change is answered for exactly the left keys that point at it."""

    operator = "FkJoin"
