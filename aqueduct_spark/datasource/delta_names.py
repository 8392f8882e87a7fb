"""Delta Lake's option names that users bring to the aqueduct data source, answered.

Users of Delta reach first for the options they know. Those the source takes under the same
name (``mergeSchema``, ``replaceWhere``, ``overwriteSchema``, ``txnAppId``, ``versionAsOf``,
``startingVersion``, ``ignoreDeletes``, ...) are in ``options.OPTIONS``; each of the others gets an
:class:`~.options.OptionError` that names what to use instead, rather than "unknown option".
"""

from __future__ import annotations

DELTA_ANSWERS: dict[str, str] = {
    "maxfilespertrigger": "a micro-batch here is bounded by rows or bytes: use "
    '.option("maxRowsPerTrigger", ...) or .option("maxBytesPerTrigger", ...)',
    "partitionoverwritemode": "to overwrite some partitions only, name them in a condition: "
    '.option("replaceWhere", "day = \'2026-01-01\'") with mode overwrite',
    "ignorechanges": "Delta's ignoreChanges reads again the rows of files a version rewrote; "
    "here a version that rewrote or removed data fails the stream unless "
    "skipChangeCommits=true skips it or readChangeFeed=true reads its changes: drop the option",
    "maxrecordsperfile": "the service sizes the files it writes itself (about 128 MB): drop "
    "the option",
    "usermetadata": "each commit records its own metadata (see `aqueduct history`): "
    "drop the option",
    "datachange": "rewriting files without changing data is the service's compaction: run "
    "`aqueduct compact` instead of a write",
    "optimizewrite": "the service writes files of about 128 MB whatever the task sizes: drop "
    "the option",
}
"""Answers to Delta Lake options the source does not take, by lower-cased name: what to use
instead. Names the source does take (mergeSchema, replaceWhere, ...) are in OPTIONS."""
