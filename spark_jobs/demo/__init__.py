"""The demo, in one place: ``make demo`` / ``lake demo``.

- ``pipelines/``: the three demo pipeline files (``demo.yaml`` consents, ``marketplace.yaml``,
  ``people.yaml``), also the bundled examples ``lake`` finds by name.
- ``dumps/``: the dump files the demo backfills.
- ``data``: the consent story's records, and large synthetic inputs for the benchmarks.
- ``stories``: the foreign-key, list and derive stories' records.
"""
