// Following a job over its event stream, through dropped connections. The API sends the whole job on connect
// and on every change, so a new connection loses nothing; and before each reconnect the job is read once more,
// so a job that finished while the stream was down is still seen in its final state, even when the stream
// cannot be opened again. A state already shown is not shown twice.
import { ApiError, ConnectionError, TimeoutError } from "./errors.js";
import { anySignal, isTerminal, sleep, type RequestOptions, type Transport } from "./http.js";
import { serverEvents } from "./sse.js";
import type { JobOut } from "./types.gen.js";

// The API writes a keepalive comment every 15 s; three missed in a row means the connection is gone.
const READ_TIMEOUT_MS = 45_000;

export interface ReconnectInfo {
  /** connections in a row that ended before delivering anything */
  attempt: number;
  waitMs: number;
  reason: string;
}

export interface FollowOptions extends RequestOptions {
  /** how long to follow in all before throwing `TimeoutError` (default: until the job ends) */
  timeoutMs?: number;
  /** told when the stream dropped and is about to be opened again */
  onReconnect?: (info: ReconnectInfo) => void;
  /** told when a connection is open and delivering */
  onConnect?: () => void;
  /** silence after which a connection counts as lost (default 45 s: three missed keepalives) */
  readTimeoutMs?: number;
}

class StreamSilent extends Error {}

// What makes a job new to whoever watches it (signed URLs are signed afresh on every read, so they do not).
function seen(job: JobOut): string {
  return JSON.stringify([job.status, job.stage, job.progress, job.queue_position, job.attempt, job.updated_at,
    job.estimate, job.ready]);
}

async function* connection(t: Transport, jobId: string, signal: AbortSignal, readTimeoutMs: number,
  onRetry: (ms: number) => void, onConnect?: () => void): AsyncGenerator<JobOut> {
  const silent = new AbortController();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const quiet = () => {
    clearTimeout(timer);
    timer = setTimeout(() => silent.abort(new StreamSilent(`no byte for ${readTimeoutMs} ms`)), readTimeoutMs);
    (timer as { unref?: () => void }).unref?.(); // a server process is not kept alive by it
  };
  quiet();
  try {
    const resp = await t.respond("GET /v1/jobs/{job_id}/stream", {
      path: { job_id: jobId }, signal: anySignal([signal, silent.signal]), headers: { Accept: "text/event-stream" } as {},
    });
    onConnect?.();
    for await (const event of serverEvents(resp.body!, quiet, onRetry)) {
      if (event.event === "job") yield JSON.parse(event.data) as JobOut;
    }
  } catch (error) {
    throw silent.signal.aborted && !signal.aborted ? silent.signal.reason : error;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The job now and at every change until it ends (completed, failed, canceled or expired), reconnecting by
 * itself. Throws `ApiError` when the API refuses it for good (`not_found`, `unauthorized`), `ConnectionError`
 * after `retry.reconnects` connections in a row delivered nothing, `TimeoutError` past `timeoutMs`; an abort of
 * `signal` ends it with the signal's reason.
 */
export async function* followJob(t: Transport, jobId: string, options: FollowOptions = {}): AsyncGenerator<JobOut, JobOut> {
  const deadline = options.timeoutMs === undefined ? undefined : AbortSignal.timeout(options.timeoutMs);
  const signal = anySignal([options.signal, deadline]);
  let shown = "";
  let failures = 0;
  let serverRetryMs: number | null = null;
  let reread = false;
  const isNew = (job: JobOut) => {
    const key = seen(job);
    if (key === shown) return false;
    shown = key;
    return true;
  };
  for (;;) {
    let reason = "the stream ended before the job finished";
    let waitMs: number | null = null;
    try {
      if (reread) {
        // One try: a failure here is one more reconnect that delivered nothing.
        const job = await t.call("GET /v1/jobs/{job_id}", { path: { job_id: jobId }, signal });
        if (isNew(job)) yield job;
        if (isTerminal(job.status)) return job;
      }
      for await (const job of connection(t, jobId, signal, options.readTimeoutMs ?? READ_TIMEOUT_MS,
        (ms) => (serverRetryMs = ms), options.onConnect)) {
        failures = 0;
        if (isNew(job)) yield job;
        if (isTerminal(job.status)) return job;
      }
    } catch (error) {
      if (signal.aborted) {
        if (options.signal?.aborted) throw options.signal.reason;
        throw new TimeoutError(`job ${jobId} did not end within ${options.timeoutMs} ms`);
      }
      if (error instanceof ApiError) {
        if (!error.retryable || ![429, 502, 503, 504].includes(error.status)) throw error;
        waitMs = error.retryAfterMs;
        reason = error.code;
      } else {
        reason = error instanceof Error ? error.message : String(error);
      }
    }
    failures += 1;
    if (failures > t.reconnects) {
      throw new ConnectionError(`the stream of job ${jobId} failed ${failures} times in a row: ${reason}`);
    }
    waitMs ??= serverRetryMs ?? t.backoff(failures);
    serverRetryMs = null;
    options.onReconnect?.({ attempt: failures, waitMs, reason });
    try {
      await sleep(waitMs, signal);
    } catch {
      if (options.signal?.aborted) throw options.signal.reason;
      throw new TimeoutError(`job ${jobId} did not end within ${options.timeoutMs} ms`);
    }
    reread = true;
  }
}
