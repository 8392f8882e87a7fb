"""The table of the ``aqueduct`` Spark data source's options: each option's name, default,
what it applies to and what it means (:data:`OPTIONS`). :mod:`.options` validates them
(``parse``); ``docs/spark-options.md`` is this table (a test keeps the two equal)."""

from __future__ import annotations

from dataclasses import dataclass

from aqueduct_core.engine.config import DEFAULT_WINDOW
from aqueduct_core.transport.config import TransportConfig
from aqueduct_spark.client.config import ClientConfig
from aqueduct_spark.datasource.option_values import duration_text, size_text


@dataclass(frozen=True)
class Option:
    name: str
    default: str
    """As documented, and what :func:`parse` reads when the option is not given (unless it
    is a word for "unset", such as none, auto or latest: then the field is None)."""
    kind: str
    """What it applies to: all, read, write, stream read, stream write."""
    meaning: str


OPTIONS: tuple[Option, ...] = (
    Option(
        "url",
        "(required)",
        "all",
        "Service address `quic://host:port`; several separated by commas: requests go to the first "
        "that answers, reads and writes are spread over them.",
    ),
    Option(
        "path",
        "(required)",
        "all",
        "The dataset name; usually given as `load(name)` / `save(name)`. Alias: `dataset`.",
    ),
    Option("token", "none (env `AQUEDUCT_TOKEN`)", "all", "Bearer token the service requires."),
    Option(
        "cafile",
        "none",
        "all",
        "PEM file of the CA that signed the service certificate: an absolute path on the "
        "driver, read there when the DataFrame or write is defined and shipped to the "
        "executors with the options (they need not have the file).",
    ),
    Option(
        "fingerprint",
        "none (env `AQUEDUCT_FINGERPRINT`)",
        "all",
        "SHA-256 fingerprint of the service certificate, as `aqueduct serve` prints it.",
    ),
    Option(
        "insecure",
        "false",
        "all",
        "Do not verify the service certificate (local tests only; warns).",
    ),
    Option(
        "backend",
        TransportConfig.backend,
        "all",
        "QUIC library: `auto` (qh3 if installed), `aioquic` or `qh3`.",
    ),
    Option(
        "transport",
        TransportConfig.transport,
        "all",
        "`auto`: each task's scan or write over TLS/TCP (kernel TCP moves bulk data at a "
        "fraction of QUIC's CPU per byte), the driver's requests (describe, plan, begin, "
        "commit) over QUIC; each falls back to the other transport 250 ms later if its own "
        "has not answered, at once if refused, and a transport that did not get through is "
        "skipped for 10 minutes in that process. `quic` or `tcp` (TLS over TCP, where UDP "
        "is blocked): that one for everything. The environment variable AQUEDUCT_TRANSPORT "
        "replaces `auto`. See [QUIC or TCP](python-client.md#quic-or-tcp).",
    ),
    Option(
        "packetSize",
        "auto",
        "all",
        "QUIC packet size in bytes; auto: largest on loopback, else the MTU of the route to "
        "the service less IP and UDP headers (1472 on Ethernet, 8972 on jumbo frames). Set it "
        "only to override that.",
    ),
    Option(
        "compression",
        ClientConfig.compression,
        "all",
        "Arrow IPC body compression on data channels, both directions. `auto`: compress "
        "when the network, not the CPU, is the limit (decided per connection from what "
        "TCP measures, revisited as data flows; the service chooses for reads); `none`, "
        "`lz4`, `zstd` or `zstd:LEVEL`: always that.",
    ),
    Option(
        "decode",
        ClientConfig.decode,
        "read",
        "Where a read's Parquet is decoded. `auto`: a row group the service need not change "
        "(no filter, cast or filled column in it) comes as stored in the table, and the "
        "task decodes it: fewer bytes on the wire and no decode at the service; the rest "
        "comes as Arrow. `service`: everything as Arrow, decoded by the service.",
    ),
    Option(
        "connectTimeout",
        duration_text(ClientConfig.connect_timeout),
        "all",
        "How long to keep trying to reach the service (every attempt and pause) before the "
        "query fails. A closed port fails in 1-3 s (the host says nothing listens); this "
        "bounds a host that answers nothing.",
    ),
    Option(
        "requestTimeout",
        duration_text(ClientConfig.timeout),
        "all",
        "How long to wait for the answer to one request, and for a service that went away "
        "(restarting) to be back.",
    ),
    Option(
        "retries",
        str(ClientConfig.retries),
        "all",
        "Reconnect attempts (with backoff) for reads and other idempotent requests.",
    ),
    Option(
        "idleTimeout",
        duration_text(TransportConfig.idle_timeout),
        "all",
        "A service silent this long is gone and the connection is reopened. A restarted "
        "service is noticed within about a second without it (it resets old connections).",
    ),
    Option(
        "maxBatchBytes",
        size_text(ClientConfig.max_batch_bytes),
        "all",
        "Largest data message (one encoded Arrow batch; a compressed one counts at the size "
        "it decompresses to): bigger batches are split, and a row above it cannot be "
        "written or read. The service has its own (`aqueduct serve --max-batch-bytes`): "
        "raise both for larger cells.",
    ),
    Option(
        "flowWindow",
        size_text(DEFAULT_WINDOW),
        "all",
        "Per-channel receive window: bytes a reader lets the service send ahead.",
    ),
    Option("versionAsOf", "latest", "read", "Read this version of the dataset (time travel)."),
    Option(
        "timestampAsOf",
        "latest",
        "read",
        "Read the version current at this time (ISO 8601, UTC if no zone).",
    ),
    Option(
        "columns",
        "all",
        "read",
        "Comma-separated columns to read (Spark cannot prune Python sources; this cuts data at the service).",
    ),
    Option("splitSize", "128MB", "read", "Target bytes per Spark partition (small files packed)."),
    Option("fileOpenCost", "64KB", "read", "Bytes each file adds when packing (openCostInBytes)."),
    Option("batchRows", "65536", "read", "Rows per Arrow batch sent by the service."),
    Option(
        "pushDownPredicate",
        "false",
        "read",
        "Let the service evaluate the filters Spark pushes (needs "
        "`spark.sql.python.filterPushdown.enabled`). Unsafe when one loaded DataFrame is "
        "reused: see [Filter pushdown](#filter-pushdown).",
    ),
    Option(
        "partitionBy",
        "none",
        "write",
        "Comma-separated partition columns, used when the write creates the dataset (Spark "
        "does not pass on `DataFrameWriter.partitionBy`).",
    ),
    Option(
        "overwriteSchema",
        "false",
        "write",
        "With mode overwrite, allow replacing the dataset's schema.",
    ),
    Option(
        "mergeSchema",
        "false",
        "write",
        "Let the data add columns to the dataset (nullable, at the end) and lack nullable "
        "ones; types cannot change. See [Replacing and merging](#replacing-and-merging).",
    ),
    Option(
        "replaceWhere",
        "none",
        "write",
        "With mode overwrite (batch), replace only the rows matching this SQL condition, "
        "e.g. `day >= '2026-01-01'`, in one commit; every row written must match it.",
    ),
    Option(
        "txnAppId",
        "none",
        "write",
        "With txnVersion (batch): an idempotent write. A write whose txnVersion is not above "
        "the last one committed for this txnAppId commits nothing.",
    ),
    Option(
        "txnVersion",
        "none",
        "write",
        "The version of this write for txnAppId: a whole number, increasing per write.",
    ),
    Option(
        "startingVersion",
        "latest",
        "read, stream read",
        "Where a new query starts: `earliest`, `latest`, or a version number. In a batch "
        "read, a number or `earliest` reads the versions from there on (a version range).",
    ),
    Option(
        "startingTimestamp",
        "none",
        "read, stream read",
        "Start at the first version committed at or after this time (overrides startingVersion).",
    ),
    Option(
        "maxRowsPerTrigger", "none", "stream read", "Most rows per micro-batch (admission control)."
    ),
    Option(
        "maxBytesPerTrigger",
        "none",
        "stream read",
        "Most bytes per micro-batch (soft: a version is never split below one file).",
    ),
    Option(
        "minRowsPerTrigger",
        "none",
        "stream read",
        "Wait for at least this many rows, up to maxTriggerDelay.",
    ),
    Option(
        "maxTriggerDelay",
        "15m",
        "stream read",
        "Longest wait for minRowsPerTrigger before a smaller micro-batch runs.",
    ),
    Option(
        "failOnDataLoss",
        "true",
        "stream read",
        "Fail the query when versions it needs were vacuumed; false skips to what exists.",
    ),
    Option(
        "pushNotifications",
        "true",
        "stream read",
        "Learn about new versions from the service's push channel (low latency); false: poll.",
    ),
    Option(
        "pollInterval",
        "1s",
        "stream read",
        "How often to poll for new versions when push notifications are off or unavailable.",
    ),
    Option(
        "endingVersion",
        "latest",
        "read",
        "Last version (inclusive) of a batch read of a version range or of the change feed.",
    ),
    Option(
        "endingTimestamp",
        "latest",
        "read",
        "End a version range at the last version committed at or before this time.",
    ),
    Option(
        "readChangeFeed",
        "false",
        "read, stream read",
        "Read the change feed: rows inserted and deleted by each version, with `_change_type`, "
        "`_commit_version` and `_commit_timestamp` (see [Change feed](#change-feed)).",
    ),
    Option(
        "skipChangeCommits",
        "false",
        "read, stream read",
        "Skip whole versions that remove or rewrite data (overwrite, delete, restore) instead "
        "of failing.",
    ),
    Option(
        "ignoreDeletes",
        "false",
        "read, stream read",
        "Skip versions that only remove data (a delete of whole files) instead of failing.",
    ),
)
