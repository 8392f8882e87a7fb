"""The one error tree of the dataset layer: one class per service status code (§9 of
``docs/dataset-protocol.md``).

The service raises these classes itself (its store included); each crosses the wire as its
code and the client rebuilds the same class (:func:`error_from_wire`). Every message says what
went wrong; what to do is in the message or, when it is the class's usual fix, in the class's
``remedy``, which ``str()`` adds (see :mod:`aqueduct_core.errors`). Only the message crosses
the wire, so the client's ``str()`` adds the remedy once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aqueduct_core.errors import AqueductError


class DatasetError(AqueductError):
    """An error answered by the dataset service. ``code`` is its wire status."""

    remedy = "look the error up in the troubleshooting guide (docs/troubleshooting.md)"

    code = "INTERNAL"

    def __init__(self, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = dict(details or {})


class DatasetNotFound(DatasetError):
    """No dataset of that name (never created, or dropped). Create it (or write with mode
    append/overwrite), or check the name with ``aqueduct ls``."""

    remedy = (
        "check the name with aqueduct ls; a write with mode append or overwrite creates the dataset"
    )

    code = "NOT_FOUND"


class DatasetExists(DatasetError):
    """A dataset of that name exists already (create / mode errorifexists)."""

    remedy = "append to the dataset, overwrite it, or drop it first"

    code = "ALREADY_EXISTS"


class SchemaMismatch(DatasetError):
    """The data's columns or types do not match the dataset's (the message lists each
    differing column), or Delta Lake cannot store them."""

    remedy = (
        "cast or rename the data's columns to match the dataset's schema (aqueduct "
        "describe NAME shows it); to change the schema, overwrite with overwriteSchema or add "
        "columns with mergeSchema"
    )

    code = "SCHEMA_MISMATCH"


class Unauthenticated(DatasetError):
    """The connection did not present the service's token (option ``token``)."""

    remedy = (
        "pass a token the service accepts: the Spark option token, AQUEDUCT_TOKEN, "
        "aqueduct --token, or Client(url, token=...)"
    )

    code = "UNAUTHENTICATED"


class PermissionDenied(DatasetError):
    """The connection's token is valid but its rights do not cover the request: the dataset is
    outside its globs, or it may only read and the request writes. Use a token with those
    rights (the service's operator grants them in its configuration file)."""

    remedy = (
        "use a token with rights on this dataset and operation, or ask the service's "
        "operator to grant them"
    )

    code = "PERMISSION_DENIED"
    permanent = True


class Conflict(DatasetError):
    """A concurrent commit changed the dataset in a way this commit cannot be applied on
    top of (e.g. two overwrites). The staged files are kept: retrying the commit is safe,
    or retry the write."""

    remedy = (
        "run the write again (a commit may be retried: its staged files are kept); avoid "
        "concurrent overwrites of one dataset"
    )

    code = "CONFLICT"


class InvalidRequest(DatasetError):
    """The request is malformed or asks for something impossible (bad name, bad filter,
    unknown operation, batch too large, data that is not Arrow). Not retryable."""

    remedy = (
        "correct the request as the message says (it is not retried); the protocol is in "
        "docs/dataset-protocol.md"
    )

    code = "INVALID_REQUEST"


class VersionNotFound(DatasetError):
    """Time travel to a version or timestamp the dataset does not have (or no longer has)."""

    remedy = "pick a version from the dataset's history (aqueduct history NAME)"

    code = "VERSION_NOT_FOUND"


class DataLoss(DatasetError):
    """Data files of the requested version are gone (vacuumed, or deleted outside the
    service). With streaming, ``failOnDataLoss=false`` skips ahead instead."""

    remedy = (
        "read a later version; for a stream, set failOnDataLoss=false to skip what is gone, "
        "and keep vacuum's retention longer than readers need"
    )

    code = "DATA_LOSS"


class Unavailable(DatasetError):
    """The service is shutting down or overloaded; retry later."""

    remedy = "retry later; if it recurs, check the service's load and log, or raise the timeout"

    code = "UNAVAILABLE"


class InternalError(DatasetError):
    """The service failed unexpectedly (an unexpected Delta Lake error, for instance); the
    message and the service's log have the details."""

    remedy = (
        "read the service's log (the stderr of aqueduct serve) for the cause, and report it "
        "if it is not a problem of the machine (a full disk, permissions on the root)"
    )

    code = "INTERNAL"


ERRORS: dict[str, type[DatasetError]] = {
    cls.code: cls
    for cls in (
        DatasetNotFound,
        DatasetExists,
        SchemaMismatch,
        Unauthenticated,
        PermissionDenied,
        Conflict,
        InvalidRequest,
        VersionNotFound,
        DataLoss,
        Unavailable,
        InternalError,
    )
}


def error_to_wire(exc: DatasetError) -> dict[str, Any]:
    return {"code": exc.code, "message": exc.message, "details": exc.details}


def error_from_wire(value: Any) -> DatasetError:
    """Rebuild the service's error as the same class (unknown codes: InternalError)."""
    if not isinstance(value, Mapping):
        return InternalError(f"malformed error from the service: {value!r}")
    cls = ERRORS.get(str(value.get("code")), InternalError)
    details = value.get("details")
    return cls(str(value.get("message", "")), details if isinstance(details, Mapping) else None)


def ok(result: Any) -> dict[str, Any]:
    return {"ok": True, "result": result}


def fail(exc: DatasetError) -> dict[str, Any]:
    return {"ok": False, "error": error_to_wire(exc)}


def unwrap(reply: Any) -> Any:
    """The result of a reply, or raise the service's error."""
    if not isinstance(reply, Mapping) or "ok" not in reply:
        raise InternalError(f"malformed reply from the service: {reply!r:.200}")
    if reply["ok"]:
        return reply.get("result")
    raise error_from_wire(reply.get("error"))
