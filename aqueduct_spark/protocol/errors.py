"""The one error tree of the dataset layer: one class per service status code (§9 of
``docs/dataset-protocol.md``).

The service raises these classes itself (its store included); each crosses the wire as its
code and the client rebuilds the same class (:func:`error_from_wire`). Every message says what
went wrong and what to do about it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aqueduct_core.errors import AqueductError


class DatasetError(AqueductError):
    """An error answered by the dataset service. ``code`` is its wire status."""

    code = "INTERNAL"

    def __init__(self, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = dict(details or {})


class DatasetNotFound(DatasetError):
    """No dataset of that name (never created, or dropped). Create it (or write with mode
    append/overwrite), or check the name with ``aqueduct ls``."""

    code = "NOT_FOUND"


class DatasetExists(DatasetError):
    """A dataset of that name exists already (create / mode errorifexists)."""

    code = "ALREADY_EXISTS"


class SchemaMismatch(DatasetError):
    """The data's columns or types do not match the dataset's (the message lists each
    differing column), or Delta Lake cannot store them."""

    code = "SCHEMA_MISMATCH"


class Unauthenticated(DatasetError):
    """The connection did not present the service's token (option ``token``)."""

    code = "UNAUTHENTICATED"


class PermissionDenied(DatasetError):
    """The connection's token is valid but its rights do not cover the request: the dataset is
    outside its globs, or it may only read and the request writes. Use a token with those
    rights (the service's operator grants them in its configuration file)."""

    code = "PERMISSION_DENIED"
    permanent = True


class Conflict(DatasetError):
    """A concurrent commit changed the dataset in a way this commit cannot be applied on
    top of (e.g. two overwrites). The staged files are kept: retrying the commit is safe,
    or retry the write."""

    code = "CONFLICT"


class InvalidRequest(DatasetError):
    """The request is malformed or asks for something impossible (bad name, bad filter,
    unknown operation, batch too large, data that is not Arrow). Not retryable."""

    code = "INVALID_REQUEST"


class VersionNotFound(DatasetError):
    """Time travel to a version or timestamp the dataset does not have (or no longer has)."""

    code = "VERSION_NOT_FOUND"


class DataLoss(DatasetError):
    """Data files of the requested version are gone (vacuumed, or deleted outside the
    service). With streaming, ``failOnDataLoss=false`` skips ahead instead."""

    code = "DATA_LOSS"


class Unavailable(DatasetError):
    """The service is shutting down or overloaded; retry later."""

    code = "UNAVAILABLE"


class InternalError(DatasetError):
    """The service failed unexpectedly (an unexpected Delta Lake error, for instance); the
    message and the service's log have the details."""

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
