// How a request reaches the API: one request id for every try of it, a timeout per try, the caller's
// AbortSignal honoured at every step, and the retries the Python client makes (clients/python/vidjobs_client/
// retrying.py): a refusal the API marks retryable (429, 503) is tried again after its `Retry-After` or a doubling
// backoff with jitter; a connection that could not be opened always; one that broke after the request went out
// only for a call that may be sent twice (a create carries its idempotency key on every try, so it may).
import { ApiError, ConnectionError, TimeoutError } from "./errors.js";
import type { Operations, Route } from "./types.gen.js";

/** An API key (`vj_…`), a platform key (`vjp_…`) or a browser token (`vjt_…`), or a function giving one (asked
 * again once when the API answers 401, so a page can fetch a fresh browser token from its backend). */
export type Credential = string | (() => string | Promise<string>);

export interface RetryOptions {
  /** tries in all, the first included (default 4) */
  attempts?: number;
  /** the first wait when the API names none, doubling each time (default 500 ms) */
  backoffMs?: number;
  /** the longest such wait (default 8 s) */
  maxBackoffMs?: number;
  /** a longer `Retry-After` is not waited out: the error is thrown at once (default 60 s) */
  maxRetryAfterMs?: number;
  /** how often in a row `follow` reconnects a stream that delivered nothing before giving up (default 8) */
  reconnects?: number;
}

export interface RetryInfo {
  /** the route, as `"GET /v1/jobs/{job_id}"` */
  route: string;
  /** the try that failed */
  attempt: number;
  /** how long before the next */
  waitMs: number;
  /** the API's code (`rate_limited`, `unavailable`, …) or the network failure */
  reason: string;
}

export interface ResponseInfo {
  route: string;
  status: number;
  attempt: number;
  requestId: string;
  ms: number;
}

export interface ClientOptions {
  /** where the API is, e.g. `https://vidjobs.example` (default `http://127.0.0.1:8080`) */
  baseUrl?: string;
  /** the credential every request shows */
  auth: Credential;
  /** with a platform key: the account whose routes it calls (`Vidjobs-Account`; the key needs the `act` scope) */
  accountId?: string;
  /** how long one try of a request may take (default 30 s) */
  timeoutMs?: number;
  retry?: RetryOptions;
  /** the fetch to use (default the platform's) */
  fetch?: typeof fetch;
  /** told before each retry, with the reason and the wait */
  onRetry?: (info: RetryInfo) => void;
  /** told of every answer (for logs and metrics) */
  onResponse?: (info: ResponseInfo) => void;
}

/** What every call takes: a signal that aborts it (and its retries), and a timeout per try. */
export interface RequestOptions {
  signal?: AbortSignal;
  timeoutMs?: number;
}

type Op<R extends Route> = Operations[R];
type Raw = Blob | ArrayBuffer | ArrayBufferView | ReadableStream<Uint8Array>;

export interface CallArgs<R extends Route> extends RequestOptions {
  path?: Op<R>["path"];
  query?: Op<R>["query"] | Record<string, string | number | boolean | null | undefined>;
  headers?: Op<R>["headers"];
  body?: Op<R>["body"];
  /** the Content-Type of a raw body */
  contentType?: string;
  /** whether sending it twice does no harm: decides a retry after a connection broke mid-request */
  replayable?: boolean;
  /** a raw body made afresh for each try (a stream cannot be sent twice) */
  makeBody?: () => Raw;
  /** the transport for this call (an upload with progress in a browser) */
  send?: (url: string, init: RequestInit) => Promise<Response>;
}

const TERMINAL = ["completed", "failed", "canceled", "expired"];
/** Whether a job's status is one it never leaves. */
export const isTerminal = (status: string): boolean => TERMINAL.includes(status);

/** `prefix` and 24 random hex digits. */
export function newId(prefix: string, bytes = 12): string {
  const random = crypto.getRandomValues(new Uint8Array(bytes));
  return prefix + Array.from(random, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** A signal aborted when any of `signals` is. */
export function anySignal(signals: (AbortSignal | undefined)[]): AbortSignal {
  const given = signals.filter((s): s is AbortSignal => s !== undefined);
  if (typeof AbortSignal.any === "function") return AbortSignal.any(given);
  const controller = new AbortController();
  for (const s of given) {
    if (s.aborted) controller.abort(s.reason);
    else s.addEventListener("abort", () => controller.abort(s.reason), { once: true });
  }
  return controller.signal;
}

/** Resolves after `ms`, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const done = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", done);
      resolve();
    }, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}

function retryAfterMs(headers: Headers): number | null {
  const value = headers.get("Retry-After");
  if (!value) return null;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : Math.max(0, at - Date.now());
}

/** The API's error answer as an `ApiError`; an answer that is not the API's JSON still becomes one. */
export async function apiError(resp: Response): Promise<ApiError> {
  const text = await resp.text().catch(() => "");
  const requestId = resp.headers.get("X-Request-Id");
  const after = retryAfterMs(resp.headers);
  try {
    const { code, message, retryable, request_id } = JSON.parse(text).error;
    if (typeof code === "string" && typeof message === "string") {
      return new ApiError(resp.status, code as ApiError["code"], message, !!retryable, request_id ?? requestId, after);
    }
  } catch {
    // not the API's JSON: a proxy's page
  }
  const retryable = [429, 502, 503, 504].includes(resp.status);
  return new ApiError(resp.status, "http_error", text.slice(0, 200).trim() || `HTTP ${resp.status}`, retryable,
    requestId, after);
}

// A connection that could not be opened never reached the API, whatever the call (Node's fetch says why in
// `cause.code`; a browser does not say, and such a failure counts as one that may have been sent).
const NEVER_SENT = ["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "UND_ERR_CONNECT_TIMEOUT", "EHOSTUNREACH"];

function neverSent(error: unknown): boolean {
  const cause = (error as { cause?: { code?: string } })?.cause;
  return NEVER_SENT.includes(cause?.code ?? "");
}

function describe(error: unknown): string {
  const cause = (error as { cause?: { code?: string; message?: string } })?.cause;
  return [String((error as Error)?.message ?? error), cause?.code ?? cause?.message].filter(Boolean).join(": ");
}

class AttemptTimedOut extends Error {}

export class Transport {
  readonly baseUrl: string;
  protected readonly options: ClientOptions;
  private readonly retry: Required<RetryOptions>;

  constructor(options: ClientOptions) {
    if (!options.auth) throw new TypeError("no credential: pass `auth` (an API key, a platform key or a browser token)");
    this.options = options;
    this.baseUrl = (options.baseUrl ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
    this.retry = { attempts: 4, backoffMs: 500, maxBackoffMs: 8000, maxRetryAfterMs: 60_000, reconnects: 8,
      ...options.retry };
  }

  /** The URL of a route with its path and query parameters. */
  url(template: string, path?: object, query?: object): string {
    const params = path as Record<string, string> | undefined;
    let url = this.baseUrl + template.replace(/\{(\w+)\}/g, (_, name: string) => encodeURIComponent(params![name]!));
    const search = new URLSearchParams();
    for (const [name, value] of Object.entries(query ?? {})) {
      if (value !== undefined && value !== null) search.append(name, String(value));
    }
    const text = search.toString();
    return text ? `${url}?${text}` : url;
  }

  /** The wait before trying again after an attempt, with jitter. */
  backoff(attempt: number): number {
    return Math.min(this.retry.maxBackoffMs, this.retry.backoffMs * 2 ** (attempt - 1)) * (0.5 + Math.random() / 2);
  }

  get reconnects(): number {
    return this.retry.reconnects;
  }

  protected async credential(fresh: boolean): Promise<string> {
    const auth = this.options.auth;
    if (typeof auth === "string") return auth;
    if (fresh || this.cached === undefined) this.cached = await auth();
    return this.cached;
  }
  private cached: string | undefined;

  /** The headers of every request: the credential, the account acted for, and the request's id. */
  async headers(requestId: string, fresh = false): Promise<Record<string, string>> {
    const headers: Record<string, string> = {
      Authorization: `Bearer ${await this.credential(fresh)}`,
      "X-Request-Id": requestId,
    };
    if (this.options.accountId) headers["Vidjobs-Account"] = this.options.accountId;
    return headers;
  }

  /** Tell the refusal's retry, or throw it. */
  private afterRefusal(route: string, attempt: number, error: ApiError, replayable: boolean): number {
    // 429 and 503 mean the request was not acted on; a proxy's 502 or 504 may hide one that was.
    const safe = error.status === 429 || error.status === 503 || ([502, 504].includes(error.status) && replayable);
    if (attempt >= this.retry.attempts || !error.retryable || !safe) throw error;
    const wait = error.retryAfterMs ?? this.backoff(attempt);
    if (wait > this.retry.maxRetryAfterMs) throw error;
    return this.told(route, attempt, wait, error.code);
  }

  private afterFailure(route: string, attempt: number, failure: unknown, replayable: boolean): number {
    const timedOut = failure instanceof AttemptTimedOut;
    if (attempt >= this.retry.attempts || !(replayable || neverSent(failure))) {
      const tries = `after ${attempt} ${attempt === 1 ? "try" : "tries"}`;
      if (timedOut) throw new TimeoutError(`${route}: no answer within ${failure.message} ms (${tries})`);
      throw new ConnectionError(`${route}: ${describe(failure)} (${tries})`, { cause: failure });
    }
    return this.told(route, attempt, this.backoff(attempt), timedOut ? "timeout" : describe(failure));
  }

  private told(route: string, attempt: number, waitMs: number, reason: string): number {
    this.options.onRetry?.({ route, attempt, waitMs, reason });
    return waitMs;
  }

  /** Send one route, retrying as the policy says, and decode its answer. */
  async call<R extends Route>(route: R, args: CallArgs<R> = {}): Promise<Op<R>["response"]> {
    const resp = await this.respond(route, args);
    const text = await resp.text();
    return (text ? JSON.parse(text) : undefined) as Op<R>["response"];
  }

  /** The successful answer of a route, as a Response whose body is still to be read (tries as `call` does). */
  async respond<R extends Route>(route: R, args: CallArgs<R> = {}): Promise<Response> {
    const space = route.indexOf(" ");
    const method = route.slice(0, space);
    const url = this.url(route.slice(space + 1), args.path, args.query);
    const requestId = newId("req_");
    const extra: Record<string, string> = { ...(args.headers as Record<string, string> | undefined) };
    let body: () => BodyInit | undefined = () => undefined;
    if (args.makeBody) {
      body = args.makeBody as () => BodyInit;
      extra["Content-Type"] = args.contentType ?? "application/octet-stream";
    } else if (args.body !== undefined) {
      const json = JSON.stringify(args.body);
      body = () => json;
      extra["Content-Type"] = "application/json";
    }
    const replayable = args.replayable ?? true;
    const timeoutMs = args.timeoutMs ?? this.options.timeoutMs ?? 30_000;
    const send = args.send ?? this.options.fetch ?? globalThis.fetch.bind(globalThis);
    let refreshed = false;
    for (let attempt = 1; ; attempt++) {
      const started = Date.now();
      const timer = new AbortController();
      const timeout = setTimeout(() => timer.abort(new AttemptTimedOut(String(timeoutMs))), timeoutMs);
      const signal = anySignal([args.signal, timer.signal]);
      let wait: number;
      try {
        const init: RequestInit & { duplex?: string } = {
          method, body: body(), signal, headers: { ...(await this.headers(requestId, refreshed)), ...extra },
        };
        if (init.body instanceof ReadableStream) init.duplex = "half";
        const resp = await send(url, init);
        this.options.onResponse?.({ route, status: resp.status, attempt, requestId, ms: Date.now() - started });
        if (resp.ok) {
          // The body is read by the caller; the try's timeout stops with the headers.
          clearTimeout(timeout);
          return resp;
        }
        const error = await apiError(resp);
        if (resp.status === 401 && typeof this.options.auth === "function" && !refreshed) {
          refreshed = true; // a browser token that expired: ask for a fresh one, once
          continue;
        }
        wait = this.afterRefusal(route, attempt, error, replayable);
      } catch (error) {
        if (args.signal?.aborted) throw args.signal.reason;
        if (error instanceof ApiError) throw error;
        const failure = timer.signal.aborted ? timer.signal.reason : error;
        wait = this.afterFailure(route, attempt, failure, replayable);
      } finally {
        clearTimeout(timeout);
      }
      await sleep(wait, args.signal);
    }
  }
}
