"""``python -m aqueduct_spark.cli``: the ``aqueduct`` command."""

import sys

from aqueduct_spark.cli import main

sys.exit(main())
