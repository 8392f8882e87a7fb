"""The service's bulk read path as it was before issue 28's work on its cost at the service
(the ``-before`` variants of the real-path benchmark), so that one run measures both:

* Parquet read through a 1 MiB buffered stream, not memory-mapped, and decoded on Arrow's
  threads for every split of 1 MiB or more whatever the cores (new: ``scan._mapped``,
  ``scan.decode_threads``);
* OpenSSL's TLS 1.3 order, AES-256-GCM first (new: ``--tls-suites``, AES-128-GCM first).

``python -m benchmarks.realpath_olddecode serve ...`` runs ``aqueduct serve ...`` that way.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any


def old_read(self: Any, split: Any) -> Iterator[Any]:
    """``SplitReader.read`` for an unpartitioned table without filters (the benchmark's)."""
    import pyarrow.parquet as pq

    from aqueduct_spark.service import scan

    with self.fs.open_input_file(split.path) as f:
        pf = pq.ParquetFile(f, pre_buffer=False, buffer_size=1 << 20)
        row_groups = list(split.row_groups) if split.row_groups is not None else None
        yield from pf.iter_batches(
            batch_size=self.batch_rows,
            row_groups=row_groups,
            columns=self._stored(pf),
            use_threads=split.bytes >= scan.THREADS_FROM,
        )


def main(argv: list[str]) -> int:
    from aqueduct_spark.cli import main as cli
    from aqueduct_spark.service import scan

    scan.SplitReader.read = old_read  # type: ignore[method-assign]
    return cli([*argv, "--tls-suites", "openssl"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
