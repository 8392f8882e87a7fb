"""The Aqueduct dataset service: named datasets stored as Delta Lake tables, served over Aqueduct.

Top down (a module imports only those below it):

- ``server``: connections, request dispatch, the streaming requests (scan, write, subscribe).
- ``operations``: the requests answered with one reply, run in worker threads.
- ``maintenance``: checkpoints, log cleanup, compaction, vacuum, restore, delete.
- ``admission``: how many requests and threads each connection gets.
- ``store``: the datasets (describe, create, drop, plan, scan, stage, commit, clean up).
- ``changes``: version ranges and the change feed.
- ``commits``: one Delta commit of a write's staged files, checked.
- ``tables``: where each dataset's table lives, and opening it at a version.
- ``scan``: splits of a pinned version, and reading one.
- ``staging``: the Parquet files a write task stages before the commit.
- ``delta_types``, ``delta_stats``, ``delta_log``: Delta's types, file statistics and log.

The errors it answers with, and the values its requests and replies carry, are
:mod:`aqueduct_spark.protocol`'s. Only this package imports ``deltalake``.
"""
