// React hooks for a person's page: a job live (stage, place in the queue, estimated start and ready range,
// outputs, error) over its event stream, reconnecting by itself and closing when the component unmounts; and
// creating a job. They run with a browser token (`vjt_…`, minted by your backend for that person), never an
// account key or a platform key, which must not reach a browser.
import { useCallback, useEffect, useMemo, useRef, useState } from "react";
import { followJob } from "./follow.js";
import { newId, Transport, type Credential, type RetryOptions } from "./http.js";
import type { CreateJob, JobError, JobOut, JobOutputs, JobStatus, QueueEstimate, ReadyEstimate, Stage } from "./types.gen.js";

export interface BrowserOptions {
  /** a browser token (`vjt_…`), or a function asking your backend for one (asked again when one expires) */
  token: Credential;
  /** where the API is (default: the page's own origin) */
  baseUrl?: string;
  retry?: RetryOptions;
}

/** The credential as a browser may hold it: a browser token, or an error saying why not. */
async function browserToken(token: Credential): Promise<string> {
  const value = typeof token === "function" ? await token() : token;
  if (!value?.startsWith("vjt_")) {
    throw new TypeError("the vidjobs hooks take a browser token (vjt_…) minted by your backend; an API key or a " +
      "platform key must never reach a browser");
  }
  return value;
}

function browserClient(options: BrowserOptions, token: () => Credential): Transport {
  return new Transport({
    baseUrl: options.baseUrl ?? globalThis.location?.origin,
    retry: options.retry,
    auth: () => browserToken(token()),
  });
}

export interface LiveJob {
  /** the job as last seen; null until the first answer */
  job: JobOut | null;
  status: JobStatus | null;
  /** only moves forward: queued, submitted, rendering, downloading, ready; or failed, canceled, expired */
  stage: Stage | null;
  /** its place among the account's waiting jobs while it waits */
  place: number | null;
  /** while it waits: when it is likely to start and be ready */
  estimate: QueueEstimate | null;
  /** while it renders: when it is likely ready */
  ready: ReadyEstimate | null;
  outputs: JobOutputs | null;
  /** why the job failed (its own error), or null */
  error: JobError | null;
  /** why the job could not be followed (an expired token, a job not found, the API unreachable), or null */
  problem: Error | null;
  /** the stream dropped and is being opened again */
  reconnecting: boolean;
  /** the job has ended: nothing more will change */
  done: boolean;
}

const TERMINAL = ["completed", "failed", "canceled", "expired"];

/**
 * The job `jobId` live. The stream closes when the job ends, when `jobId` changes and when the component
 * unmounts; a dropped stream is opened again by itself, reading the job first so its final state is never
 * missed.
 */
export function useJob(jobId: string | null | undefined, options: BrowserOptions): LiveJob {
  const [job, setJob] = useState<JobOut | null>(null);
  const [problem, setProblem] = useState<Error | null>(null);
  const [reconnecting, setReconnecting] = useState(false);
  const token = useRef(options.token);
  token.current = options.token; // a new token is used from the next request on, without reconnecting
  const { baseUrl } = options;
  const client = useMemo(() => browserClient(options, () => token.current), [baseUrl]);

  useEffect(() => {
    setJob(null);
    setProblem(null);
    setReconnecting(false);
    if (!jobId) return;
    const stop = new AbortController();
    (async () => {
      try {
        if (typeof token.current === "string") await browserToken(token.current); // refused before any request
        for await (const state of followJob(client, jobId, {
          signal: stop.signal,
          onReconnect: () => setReconnecting(true),
          onConnect: () => setReconnecting(false),
        })) {
          setJob(state);
          setReconnecting(false);
        }
      } catch (error) {
        if (!stop.signal.aborted) {
          setProblem(error as Error);
          setReconnecting(false);
        }
      }
    })();
    return () => stop.abort(new DOMException("the component stopped following the job", "AbortError"));
  }, [jobId, client]);

  return {
    job,
    status: job?.status ?? null,
    stage: job?.stage ?? null,
    place: job?.queue_position ?? null,
    estimate: job?.estimate ?? null,
    ready: job?.ready ?? null,
    outputs: job?.outputs ?? null,
    error: job?.error ?? null,
    problem,
    reconnecting,
    done: !!job && TERMINAL.includes(job.status),
  };
}

export interface CreateJobState {
  /** create a job (a token with the `create` scope); one idempotency key for every try of one call */
  create: (body: CreateJob, options?: { idempotencyKey?: string; signal?: AbortSignal }) => Promise<JobOut>;
  /** the job the last create made */
  job: JobOut | null;
  pending: boolean;
  /** why the last create failed (an `ApiError`: `quota_exhausted`, `invalid_input`, …) */
  error: Error | null;
  reset: () => void;
}

/** Creating jobs from the page, with the person's browser token. */
export function useCreateJob(options: BrowserOptions): CreateJobState {
  const [job, setJob] = useState<JobOut | null>(null);
  const [pending, setPending] = useState(false);
  const [error, setError] = useState<Error | null>(null);
  const token = useRef(options.token);
  token.current = options.token;
  const { baseUrl } = options;
  const client = useMemo(() => browserClient(options, () => token.current), [baseUrl]);

  const create = useCallback(async (body: CreateJob, o: { idempotencyKey?: string; signal?: AbortSignal } = {}) => {
    setPending(true);
    setError(null);
    try {
      if (typeof token.current === "string") await browserToken(token.current);
      const made = await client.call("POST /v1/jobs", {
        body, signal: o.signal, headers: { "Idempotency-Key": o.idempotencyKey ?? newId("idem_", 16) },
      });
      setJob(made);
      return made;
    } catch (failure) {
      setError(failure as Error);
      throw failure;
    } finally {
      setPending(false);
    }
  }, [client]);

  const reset = useCallback(() => {
    setJob(null);
    setError(null);
  }, []);
  return { create, job, pending, error, reset };
}
