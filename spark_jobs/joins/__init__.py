"""Continuous joins of topics, kept in Delta: the kinds (``kinds``), the engine (``engine``, and
``keyed`` for fk, list and derive, with ``job_for`` choosing a kind's engine class), poison pills
(``poison``), running it as a Spark Structured Streaming query (``runner``, ``supervise``) and checking
it against a batch join (``oracle``)."""
