"""Continuous joins of topics, kept in Delta: the engine (``engine``), running it as a Spark
Structured Streaming query (``runner``) and checking it against a batch join (``oracle``)."""
