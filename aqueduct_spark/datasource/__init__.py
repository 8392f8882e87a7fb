"""The ``aqueduct`` Spark data source (PySpark 4.3 Python Data Source API).

Reads::

    spark.read.format("aqueduct").option("url", "quic://host:4433").load("trips")

Writes (mode append or overwrite; Spark rejects its default mode for Python sources)::

    df.write.format("aqueduct").option("url", url).mode("append").save("trips")

Every option, with its default, is in :data:`aqueduct_spark.datasource.options.OPTIONS` and
``docs/spark-options.md``. Register once per session with :func:`register` (or install the
package: ``pyspark_aqueduct`` registers it automatically). Errors reach the driver program
inside PySpark's exceptions; :func:`aqueduct_error` finds ours there (``.task_errors``).

What runs where (see ``shared/design/spark-datasource-api.md``): options are parsed and the
service contacted for the schema and the plan on the driver; each partition is one split of
one pinned dataset version, and carries everything its executor needs. Executors open (or
reuse) a pooled QUIC connection and receive Arrow batches already cast to Spark's schema by
the service. A write stages each task's data under a transaction; the driver's commit
publishes all of it in one Delta commit, and only the successful attempt of each task is
committed, so a retried or speculative task never duplicates rows.

The modules, bottom first: ``option_values`` and ``options`` (the table of options, parsed
once), ``schemas`` (Spark <-> Arrow), ``reader`` and ``writer`` (batch), ``stream_offsets``,
``changes`` (version ranges, the change feed, versions that remove data), ``notifications``,
``stream_reader`` and ``stream_writer`` (Structured Streaming), ``source`` (the
``DataSource`` Spark instantiates, which picks among them), ``stopping`` (a streaming query
stopped between micro-batches).
"""

from aqueduct_spark.datasource.source import AqueductDataSource, register
from aqueduct_spark.datasource.stopping import stop_gracefully
from aqueduct_spark.datasource.task_errors import aqueduct_error

__all__ = ["AqueductDataSource", "aqueduct_error", "register", "stop_gracefully"]
