"""Data-quality suites: completeness, co-partitioning, key format, framing and lookup basics.

- :mod:`.suites`: the suite files (versioned YAML in ``expectations/``) and the table of check types;
- one module per check type (:mod:`.completeness`, :mod:`.co_partitioning`, :mod:`.key_format`,
  :mod:`.framing`, :mod:`.lookup_basics`): its parameters, the topics it reads, its findings (Spark)
  and expectations;
- :mod:`.findings`: a finding as a typed row (key, topic, records' offsets, placements);
- :mod:`.gx`: the Great Expectations adapter (validation and Data Docs);
- :mod:`.run`: a quality run over the topics as Kafka holds them, recorded in ``quality_runs``;
- :mod:`.results`: what a run answers (each expectation's result, the run's report);
- :mod:`.pages`: the report pages (one per pipeline, an index, and each run's own page).
"""
