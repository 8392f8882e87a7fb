"""Auto-registration: Spark imports top-level ``pyspark_*`` modules at its first data-source
lookup and registers their ``DefaultSource``, so ``format("aqueduct")`` works with no call."""

from aqueduct_spark.datasource import AqueductDataSource as DefaultSource

__all__ = ["DefaultSource"]
