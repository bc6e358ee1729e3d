import type { ErrorBody } from "./types.gen.js";

/** Everything this client throws (but an `AbortError` when the caller's own signal aborts). */
export class VidjobsError extends Error {
  override name = "VidjobsError";
}

/**
 * The API answered with an error. `code` is the API's error code (`error.code`, docs/API.md "Errors"); an answer
 * that was not the API's own (a proxy's page) carries `http_error`.
 */
export class ApiError extends VidjobsError {
  override name = "ApiError";
  constructor(
    /** the HTTP status */
    readonly status: number,
    /** the API's error code: `invalid_input`, `quota_exhausted`, `rate_limited`, `not_found`, ... */
    readonly code: ErrorBody["code"] | "http_error",
    message: string,
    /** whether the same request may succeed later */
    readonly retryable: boolean,
    /** the request id to quote when asking about it */
    readonly requestId: string | null,
    /** what `Retry-After` said, in milliseconds */
    readonly retryAfterMs: number | null,
  ) {
    super(`${message} (${code}, HTTP ${status}${requestId ? `, request ${requestId}` : ""})`);
  }
}

/** The API could not be reached, or stopped answering, after every retry (`cause` is the last failure). */
export class ConnectionError extends VidjobsError {
  override name = "ConnectionError";
}

/** A request, `wait()` or `follow()` ran past its `timeoutMs`; a job itself goes on. */
export class TimeoutError extends VidjobsError {
  override name = "TimeoutError";
}

/** The server decoded an uploaded image and refused it: `code` says why (`image_corrupt`, `image_too_large`, ...). */
export class UploadRejectedError extends VidjobsError {
  override name = "UploadRejectedError";
  constructor(readonly uploadId: string, readonly code: string, readonly reason: string) {
    super(`upload ${uploadId} was rejected: ${reason} (${code})`);
  }
}

/** A webhook whose signature, timestamp or headers do not verify; answer it 400 and drop it. */
export class WebhookVerificationError extends VidjobsError {
  override name = "WebhookVerificationError";
}
