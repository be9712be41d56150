"""How long-running work runs: the job registry, stopping cleanly, profiles.

- ``jobs``: the registry of continuous joins and ingests, and their detached runs.
- ``stopping``: a query stops after its current micro-batch on SIGTERM or Ctrl-C.
- ``profile``: where a micro-batch's time goes.
"""
