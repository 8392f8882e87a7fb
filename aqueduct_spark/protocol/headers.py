"""Protocol version, header keys and size limits of the dataset protocol (§2, §6 of
``docs/dataset-protocol.md``). Keys follow the spec style: a short name, a dash, 6 hex digits."""

from __future__ import annotations

PROTOCOL_VERSION = 1

# Connection headers.
H_VERSION = b"aqds-version-4b1f0a"
H_TOKEN = b"aqds-token-4b1f0a"
# Channel headers of data channels (set by the channel's creator, the client).
H_SCHEMA = b"aqds-schema-4b1f0a"
"""Arrow IPC schema of the batches on the channel."""
H_COMPRESSION = b"aqds-compression-4b1f0a"
"""IPC body compression the reader asks for: none, lz4, zstd or zstd:LEVEL."""
H_CODECS = b"aqds-codecs-4b1f0a"
"""The codecs a reader decodes (``lz4,zstd``), leaving the choice to the sender (``auto``)."""
H_FORMATS = b"aqds-formats-4b1f0a"
"""Data formats a reader decodes besides Arrow IPC record batches (``parquet``): the service
may then send a row group as stored (``protocol.parquet``)."""
# Message headers of data messages.
H_BATCH = b"aqds-batch-4b1f0a"
"""CBOR {"rows": n, "seq": i} for each batch."""
H_PARQUET = b"aqds-parquet-4b1f0a"
"""CBOR {"row_group", "rows", "columns", "size", "footer", "ranges"}: this data message is a
row group of a Parquet file, not an Arrow record batch (``protocol.parquet``)."""
H_ERROR = b"aqds-error-4b1f0a"
"""CBOR {"code", "message"}: the sender failed; this is its last message (the channel is then
finished, not cancelled: a cancel could drop this very message)."""

COMPRESSIONS = ("none", "lz4", "zstd")
MAX_BATCH_BYTES = 64 * 1024 * 1024
"""A batch larger than this is refused; writers split bigger batches first."""
