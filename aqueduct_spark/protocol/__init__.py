"""The Aqueduct dataset protocol, version 1 (specified in ``docs/dataset-protocol.md``).

Requests are CBOR maps sent on the entrypoint channel; each carries the channel(s) for its
answer as attachments. Replies on a oneshot are ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": {"code": ..., "message": ...}}``. Arrow data travels on raw
channels, one IPC record batch message per Aqueduct message, with the Arrow schema in the
channel headers and per-batch CBOR metadata in the message headers.

Shared by the service and the client, and importing neither (nor Delta Lake): constants
(:mod:`.headers`), the one error tree (:mod:`.errors`, one class per status code, rebuilt
as the same class on the client), the values requests and replies carry (:mod:`.messages`),
the Arrow payload codec (:mod:`.arrow`) and the filter encoding (:mod:`.filters`). Import
the names from here: ``from aqueduct_spark import protocol as P``.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .arrow import (
        DataMessage,
        batch_header,
        batch_to_payload,
        describe_size,
        error_header,
        find_header,
        ipc_options,
        payloads_within,
        read_data_message,
        schema_from_bytes,
        schema_to_bytes,
        skipped_rows,
    )
    from .compression import (
        AUTO,
        CODECS,
        AutoCompression,
        Compression,
        accepted_codecs,
        negotiate,
        request_headers,
        write_options,
    )
    from .errors import (
        ERRORS,
        Conflict,
        DataLoss,
        DatasetError,
        DatasetExists,
        DatasetNotFound,
        InternalError,
        InvalidRequest,
        PermissionDenied,
        SchemaMismatch,
        Unauthenticated,
        Unavailable,
        VersionNotFound,
        error_from_wire,
        error_to_wire,
        fail,
        ok,
        unwrap,
    )
    from .filters import (
        BINARY_OPS,
        NOT,
        UNARY_OPS,
        to_wire_filters,
    )
    from .headers import (
        COMPRESSIONS,
        H_BATCH,
        H_CODECS,
        H_COMPRESSION,
        H_ERROR,
        H_FORMATS,
        H_PARQUET,
        H_SCHEMA,
        H_TOKEN,
        H_VERSION,
        MAX_BATCH_BYTES,
        PROTOCOL_VERSION,
    )
    from .messages import (
        CHANGE_FIELDS,
        CommitResult,
        DatasetInfo,
        ScanPlan,
        Split,
        StagedFile,
        VersionInfo,
        pack_tasks,
        require_int,
        staged_list,
    )
else:
    from aqueduct_core.lazy import attach

    __getattr__, __dir__ = attach(__name__, __file__)

__all__ = [
    "AUTO",
    "BINARY_OPS",
    "CHANGE_FIELDS",
    "CODECS",
    "COMPRESSIONS",
    "ERRORS",
    "H_BATCH",
    "H_CODECS",
    "H_COMPRESSION",
    "H_ERROR",
    "H_FORMATS",
    "H_PARQUET",
    "H_SCHEMA",
    "H_TOKEN",
    "H_VERSION",
    "MAX_BATCH_BYTES",
    "NOT",
    "PROTOCOL_VERSION",
    "UNARY_OPS",
    "AutoCompression",
    "CommitResult",
    "Compression",
    "Conflict",
    "DataLoss",
    "DataMessage",
    "DatasetError",
    "DatasetExists",
    "DatasetInfo",
    "DatasetNotFound",
    "InternalError",
    "InvalidRequest",
    "PermissionDenied",
    "ScanPlan",
    "SchemaMismatch",
    "Split",
    "StagedFile",
    "Unauthenticated",
    "Unavailable",
    "VersionInfo",
    "VersionNotFound",
    "accepted_codecs",
    "batch_header",
    "batch_to_payload",
    "describe_size",
    "error_from_wire",
    "error_header",
    "error_to_wire",
    "fail",
    "find_header",
    "ipc_options",
    "negotiate",
    "ok",
    "pack_tasks",
    "payloads_within",
    "read_data_message",
    "request_headers",
    "require_int",
    "schema_from_bytes",
    "schema_to_bytes",
    "skipped_rows",
    "staged_list",
    "to_wire_filters",
    "unwrap",
    "write_options",
]
