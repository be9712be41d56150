"""How long-running work runs: the job registry, stopping cleanly, crash points, profiles.

- ``jobs``: the registry of continuous joins and ingests, and their detached runs.
- ``stopping``: a query stops after its current micro-batch on SIGTERM or Ctrl-C.
- ``profile``: where a micro-batch's time goes.
- ``faults``: the crash points the fault tests set with ``LAKE_KILL_AT``.
"""
