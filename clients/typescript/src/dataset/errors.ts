/** The dataset protocol's errors (docs/dataset-protocol.md §9): one class per status code,
 * rebuilt from the code the service sends; `message` is the service's own words. */
import { AqueductError } from "../wire/index.js";

export class DatasetError extends AqueductError {
  override name = "DatasetError";
  constructor(
    readonly code: string,
    message: string,
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

const NAMES: Record<string, string> = {
  NOT_FOUND: "DatasetNotFound",
  ALREADY_EXISTS: "DatasetExists",
  SCHEMA_MISMATCH: "SchemaMismatch",
  UNAUTHENTICATED: "Unauthenticated",
  PERMISSION_DENIED: "PermissionDenied",
  CONFLICT: "Conflict",
  INVALID_REQUEST: "InvalidRequest",
  VERSION_NOT_FOUND: "VersionNotFound",
  DATA_LOSS: "DataLoss",
  UNAVAILABLE: "Unavailable",
  INTERNAL: "InternalError",
};

/** The error a reply or an error message carries ({code, message, details}). */
export function errorFromWire(value: unknown): DatasetError {
  const v = (value ?? {}) as { code?: unknown; message?: unknown; details?: unknown };
  const code = typeof v.code === "string" && v.code in NAMES ? v.code : "INTERNAL";
  const err = new DatasetError(code, typeof v.message === "string" ? v.message : String(v.message ?? "the service failed"), (v.details ?? {}) as Record<string, unknown>);
  err.name = NAMES[code]!;
  return err;
}

/** The result of a reply, or its error thrown. */
export function unwrap(reply: unknown): unknown {
  const r = reply as { ok?: unknown; result?: unknown; error?: unknown } | null;
  if (r === null || typeof r !== "object") throw new DatasetError("INTERNAL", "the service sent a reply that is not a map");
  if (r.ok === true) return r.result;
  throw errorFromWire(r.error);
}
