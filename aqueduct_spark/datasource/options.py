"""Every option of the ``aqueduct`` Spark data source: one table, validated once.

Spark passes options as lower-cased keys with string values; :func:`parse` checks them all on
the driver (when the DataFrame is defined) and returns typed :class:`Options`, so a typo or
a bad value fails at once with a message naming the option and the fix, not later on an
executor. ``OPTIONS`` (:mod:`.option_table`) is also the source of ``docs/spark-options.md`` (a test keeps the two
equal).

Each default is written once. A setting the dataset client has too (timeouts, retries,
compression, the QUIC library, the flow window) takes its default from the client's
configuration; the others have theirs in ``OPTIONS``, which :func:`parse` reads when an
option is not given. A default that means "not set" (``none``, ``auto``, ``latest``) is a
``None`` field of :class:`Options`.
"""

from __future__ import annotations

import datetime as dt
import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aqueduct_core.engine.config import EngineConfig
from aqueduct_core.transport.config import TransportConfig
from aqueduct_core.transport.tls import ClientTLS
from aqueduct_spark.client.config import ClientConfig, check_decode
from aqueduct_spark.client.urls import parse_url
from aqueduct_spark.datasource.delta_names import DELTA_ANSWERS
from aqueduct_spark.datasource.option_table import OPTIONS as OPTIONS  # re-exported
from aqueduct_spark.datasource.option_table import Option as Option
from aqueduct_spark.datasource.option_values import (
    OptionError as OptionError,  # re-exported: where users and modules look for it
)
from aqueduct_spark.datasource.option_values import (
    parse_bool,
    parse_ca,
    parse_duration,
    parse_int,
    parse_size,
    parse_timestamp,
)
from aqueduct_spark.protocol.compression import Compression

if TYPE_CHECKING:
    from aqueduct_spark.client.blocking import Client


_BY_KEY = {o.name.lower(): o for o in OPTIONS}
_ALIASES = {"dataset": "path"}
_SPARK_KEYS = {"checkpointlocation", "queryname"}
"""Options Spark itself passes to streaming sinks: accepted and left to Spark."""


def _catalog_table_extras(raw: Mapping[str, str]) -> set[str]:
    """Keys of ``raw`` that a catalog table adds and that are not the user's OPTIONS.

    For a table, Spark passes every table property as an option (``provider``, ``owner``,
    ``location``, any TBLPROPERTIES) and each ``OPTIONS (k v)`` twice, as ``k`` and as
    ``option.k``; ``path`` (from OPTIONS or LOCATION) comes once. So a key other than
    ``path`` without an ``option.`` twin is a table property, not meant for the source."""
    keys = {k.lower() for k in raw}
    if "provider" not in keys:
        return set()  # not a catalog table: every key is an option
    user = {k.removeprefix("option.") for k in keys if k.startswith("option.")} | {"path"}
    return {k for k in keys if k.startswith("option.") or k not in user}


@dataclass(frozen=True)
class Options:
    """Parsed options. Picklable, so Spark ships it to executors. Only :func:`parse` makes
    them: the defaults are in ``OPTIONS`` (and the client's configuration), not here."""

    url: str
    dataset: str
    token: str | None
    cafile: str | None
    """The CA file's path on the driver, for messages; executors use ``ca_pem``."""
    ca_pem: str | None
    """The CA file's content, read on the driver."""
    fingerprint: str | None
    insecure: bool
    backend: str
    transport: str
    packet_size: int | None
    compression: str
    decode: str
    connect_timeout: float
    request_timeout: float
    retries: int
    idle_timeout: float
    max_batch_bytes: int
    flow_window: int
    version_as_of: int | None
    timestamp_as_of: dt.datetime | None
    columns: tuple[str, ...] | None
    split_size: int
    file_open_cost: int
    batch_rows: int
    push_down_predicate: bool
    partition_by: tuple[str, ...]
    overwrite_schema: bool
    merge_schema: bool
    replace_where: str | None
    txn_app_id: str | None
    txn_version: int | None
    starting_version: str
    starting_timestamp: dt.datetime | None
    max_rows_per_trigger: int | None
    max_bytes_per_trigger: int | None
    min_rows_per_trigger: int | None
    max_trigger_delay: float
    fail_on_data_loss: bool
    push_notifications: bool
    poll_interval: float
    ending_version: int | None
    ending_timestamp: dt.datetime | None
    read_change_feed: bool
    skip_change_commits: bool
    ignore_deletes: bool
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def version_range(self) -> bool:
        """Whether a batch read reads a range of versions (or the change feed), not one."""
        return (
            self.read_change_feed
            or self.starting_version != "latest"
            or self.starting_timestamp is not None
            or self.ending_version is not None
            or self.ending_timestamp is not None
        )

    def client(self) -> Client:
        """A dataset client for these options (its connections are pooled per process)."""
        from aqueduct_spark.client.blocking import Client  # not needed to check options

        return Client(config=self.client_config())

    def client_config(self) -> ClientConfig:
        """The dataset client's configuration for these options."""
        if self.ca_pem is not None:
            tls = ClientTLS(cadata=self.ca_pem)
        elif self.fingerprint is not None:
            tls = ClientTLS(fingerprint=self.fingerprint)
        else:
            tls = ClientTLS(insecure=self.insecure)
        transport = TransportConfig(
            backend=self.backend,  # type: ignore[arg-type]
            transport=self.transport,  # type: ignore[arg-type]
            packet_size=self.packet_size,
            idle_timeout=self.idle_timeout,
            engine=EngineConfig(flow_window=self.flow_window),
        )
        return ClientConfig(
            self.url,
            token=self.token,
            tls=tls,
            transport=transport,
            retries=self.retries,
            timeout=self.request_timeout,
            connect_timeout=self.connect_timeout,
            compression=self.compression,
            decode=self.decode,
            max_batch_bytes=self.max_batch_bytes,
        )


def parse(raw: Mapping[str, str]) -> Options:
    """Validate every option (keys case-insensitive); raise OptionError on the first problem."""
    if not any(k.lower() not in _SPARK_KEYS for k in raw):
        raise OptionError(
            "the aqueduct data source got no options. If this is a catalog table (CREATE TABLE"
            " ... USING aqueduct), Spark 4.3 does not pass a table's OPTIONS to Python data"
            " sources: use CREATE TEMPORARY VIEW ... USING aqueduct OPTIONS (...) instead, or"
            " give the options with each query: SELECT ... FROM t WITH ('url' = '...', 'path' ="
            " '...'), spark.read.options(...).table(t), INSERT INTO t WITH (...) SELECT ...,"
            ' df.writeTo(t).options(...).append(). Otherwise give at least .option("url", ...)'
            " and the dataset name."
        )
    given: dict[str, str] = {}
    extras = _catalog_table_extras(raw)
    for key, value in raw.items():
        if key.lower() in extras:
            continue
        k = _ALIASES.get(key.lower(), key.lower())
        if k in _SPARK_KEYS:
            continue
        if k not in _BY_KEY and k in DELTA_ANSWERS:
            raise OptionError(
                f"option {key!r} is Delta Lake's, not the aqueduct data source's: "
                f"{DELTA_ANSWERS[k]}"
            )
        if k not in _BY_KEY:
            names = {o.name.lower(): o.name for o in OPTIONS}
            close = [names[n] for n in difflib.get_close_matches(k, names, n=3, cutoff=0.7)]
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise OptionError(f"unknown option {key!r} for the aqueduct data source.{hint}")
        given[k] = str(value)

    def get(name: str) -> str | None:
        return given.get(name.lower())

    def text(name: str) -> str:
        """The value given (if not empty), else the default in OPTIONS."""
        return get(name) or _BY_KEY[name.lower()].default

    url = get("url") or os.environ.get("AQUEDUCT_URL")
    if not url:
        raise OptionError(
            'the aqueduct data source needs option "url", e.g. .option("url", "quic://host:4433")'
        )
    try:
        parse_url(url)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    dataset = get("path")
    if not dataset:
        raise OptionError(
            'name the dataset: .load("name") / .save("name") or .option("dataset", "name")'
        )
    trust = [k for k in ("cafile", "fingerprint") if get(k)] + (
        ["insecure"] if parse_bool("insecure", text("insecure")) else []
    )
    if len(trust) > 1:
        raise OptionError(
            f"choose one of cafile, fingerprint or insecure, not {' and '.join(trust)}"
        )
    ca = parse_ca("cafile", get("cafile") or "") if get("cafile") else None
    compression = text("compression").lower()
    try:
        Compression.parse(compression, "option 'compression'")
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    try:
        decode = check_decode(text("decode"), "option 'decode'")
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    backend = text("backend").lower()
    if backend not in ("auto", "aioquic", "qh3"):
        raise OptionError(f"option 'backend' must be auto, aioquic or qh3, got {backend!r}")
    transport = text("transport").lower()
    if transport not in ("auto", "quic", "tcp"):
        raise OptionError(f"option 'transport' must be auto, quic or tcp, got {transport!r}")
    starting = text("startingVersion").lower()
    if starting not in ("latest", "earliest"):
        parse_int("startingVersion", starting)
    if (get("txnAppId") is None) != (get("txnVersion") is None):
        raise OptionError(
            "give txnAppId and txnVersion together (an idempotent write needs both), or neither"
        )
    version = get("versionAsOf")
    timestamp = get("timestampAsOf")
    if version is not None and timestamp is not None:
        raise OptionError("give versionAsOf or timestampAsOf, not both")
    ranged = [k for k in ("endingVersion", "endingTimestamp", "readChangeFeed") if get(k)]
    if (version is not None or timestamp is not None) and ranged:
        raise OptionError(
            f"versionAsOf/timestampAsOf read one version; {ranged[0]} reads a range of them: "
            "give one or the other"
        )
    if get("endingVersion") is not None and get("endingTimestamp") is not None:
        raise OptionError("give endingVersion or endingTimestamp, not both")

    def split(value: str | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        items = tuple(v.strip() for v in value.split(",") if v.strip())
        return items or None

    def opt_int(name: str, minimum: int = 1) -> int | None:
        value = get(name)
        return None if value is None else parse_int(name, value, minimum)

    return Options(
        url=url,
        dataset=dataset,
        token=get("token") or os.environ.get("AQUEDUCT_TOKEN"),
        cafile=ca[0] if ca else None,
        ca_pem=ca[1] if ca else None,
        # The environment's fingerprint only where the options choose no way to trust.
        fingerprint=get("fingerprint")
        or (None if trust else os.environ.get("AQUEDUCT_FINGERPRINT")),
        insecure="insecure" in trust,
        backend=backend,
        transport=transport,
        packet_size=opt_int("packetSize", 1200),
        compression=compression,
        decode=decode,
        connect_timeout=parse_duration("connectTimeout", text("connectTimeout")),
        request_timeout=parse_duration("requestTimeout", text("requestTimeout")),
        retries=parse_int("retries", text("retries")),
        idle_timeout=parse_duration("idleTimeout", text("idleTimeout")),
        max_batch_bytes=parse_size("maxBatchBytes", text("maxBatchBytes")),
        flow_window=parse_size("flowWindow", text("flowWindow")),
        version_as_of=None if version is None else parse_int("versionAsOf", version),
        timestamp_as_of=None if timestamp is None else parse_timestamp("timestampAsOf", timestamp),
        columns=split(get("columns")),
        split_size=parse_size("splitSize", text("splitSize")),
        file_open_cost=parse_size("fileOpenCost", text("fileOpenCost")),
        batch_rows=parse_int("batchRows", text("batchRows"), 1),
        push_down_predicate=parse_bool("pushDownPredicate", text("pushDownPredicate")),
        partition_by=split(get("partitionBy")) or (),
        overwrite_schema=parse_bool("overwriteSchema", text("overwriteSchema")),
        merge_schema=parse_bool("mergeSchema", text("mergeSchema")),
        replace_where=(get("replaceWhere") or "").strip() or None,
        txn_app_id=get("txnAppId"),
        txn_version=None
        if get("txnVersion") is None
        else parse_int("txnVersion", get("txnVersion") or ""),
        starting_version=starting,
        starting_timestamp=None
        if get("startingTimestamp") is None
        else parse_timestamp("startingTimestamp", get("startingTimestamp") or ""),
        max_rows_per_trigger=opt_int("maxRowsPerTrigger"),
        max_bytes_per_trigger=None
        if get("maxBytesPerTrigger") is None
        else parse_size("maxBytesPerTrigger", get("maxBytesPerTrigger") or ""),
        min_rows_per_trigger=opt_int("minRowsPerTrigger"),
        max_trigger_delay=parse_duration("maxTriggerDelay", text("maxTriggerDelay")),
        fail_on_data_loss=parse_bool("failOnDataLoss", text("failOnDataLoss")),
        push_notifications=parse_bool("pushNotifications", text("pushNotifications")),
        poll_interval=parse_duration("pollInterval", text("pollInterval")),
        ending_version=opt_int("endingVersion", 0),
        ending_timestamp=None
        if get("endingTimestamp") is None
        else parse_timestamp("endingTimestamp", get("endingTimestamp") or ""),
        read_change_feed=parse_bool("readChangeFeed", text("readChangeFeed")),
        skip_change_commits=parse_bool("skipChangeCommits", text("skipChangeCommits")),
        ignore_deletes=parse_bool("ignoreDeletes", text("ignoreDeletes")),
    )
