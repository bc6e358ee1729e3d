// The client: one object per credential, its calls grouped as the API's routes are. Every call takes a signal and
// a timeout and is retried as src/http.ts says; every answer is typed from the OpenAPI document (types.gen.ts).
import { TimeoutError, UploadRejectedError } from "./errors.js";
import { followJob, type FollowOptions } from "./follow.js";
import { isTerminal, newId, sleep, Transport, type ClientOptions, type RequestOptions } from "./http.js";
import type * as T from "./types.gen.js";

export type Job = T.JobOut;
export type Upload = T.UploadOut;
export type Export = T.ExportOut;

export interface Page<Item> {
  data: Item[];
  next_cursor?: string | null;
}

export interface ListJobsOptions extends RequestOptions {
  /** one status or several */
  status?: T.JobStatus | T.JobStatus[];
  model?: string;
  created_after?: string | Date;
  created_before?: string | Date;
  /** only jobs whose metadata has these values */
  metadata?: Record<string, string>;
  /** jobs per page, 1-100 */
  limit?: number;
  cursor?: string | null;
}

export interface PageOptions extends RequestOptions {
  limit?: number;
  cursor?: string | null;
}

export interface UsageOptions extends RequestOptions {
  /** `model`, `day` (UTC, the default) or `metadata.<key>` */
  group_by?: string;
  from?: string | Date;
  to?: string | Date;
}

export interface Keyed extends RequestOptions {
  /** the same key sent again answers the same job; one is made for each call when not given */
  idempotencyKey?: string;
}

export interface WaitOptions extends FollowOptions {
  /** every state on the way, the last one included */
  onChange?: (job: Job) => void;
}

export interface UploadOptions extends RequestOptions {
  /** the image's type (default: the Blob's own, else application/octet-stream; the server sniffs it anyway) */
  contentType?: string;
  /** bytes sent so far and in all, where the platform tells (a browser; Node, Deno and Bun) */
  onProgress?: (sent: number, total: number) => void;
  /** wait until the server decoded it (default true): `UploadRejectedError` if it refused the image */
  wait?: boolean;
  /** how long to wait for that (default 120 s) */
  waitTimeoutMs?: number;
}

type Bytes = Blob | ArrayBuffer | ArrayBufferView;
const iso = (t: string | Date | undefined) => (t instanceof Date ? t.toISOString() : t);

/** Every item of every page, fetching pages as they are needed. */
async function* everyItem<Item>(page: (cursor: string | null) => Promise<Page<Item>>): AsyncGenerator<Item> {
  let cursor: string | null = null;
  do {
    const found: Page<Item> = await page(cursor);
    yield* found.data;
    cursor = found.next_cursor ?? null;
  } while (cursor);
}

/** Ask again, at growing pauses, until `done`; `TimeoutError` past `timeoutMs`. */
async function poll<V>(first: V, next: () => Promise<V>, done: (v: V) => boolean, timeoutMs: number, what: string,
  signal?: AbortSignal): Promise<V> {
  const until = Date.now() + timeoutMs;
  let pause = 200;
  let current = first;
  while (!done(current)) {
    if (Date.now() + pause > until) throw new TimeoutError(`${what} after ${timeoutMs} ms`);
    await sleep(pause, signal);
    pause = Math.min(pause * 1.5, 2000);
    current = await next();
  }
  return current;
}

async function bytesOf(data: Bytes): Promise<Uint8Array> {
  if (data instanceof Uint8Array) return data;
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  return new Uint8Array(await data.arrayBuffer());
}

// A browser reports an upload's progress only through XMLHttpRequest; this sends one as fetch would.
function xhrSend(onProgress: (sent: number, total: number) => void) {
  return (url: string, init: RequestInit) => new Promise<Response>((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open(init.method!, url);
    for (const [name, value] of Object.entries(init.headers as Record<string, string>)) xhr.setRequestHeader(name, value);
    xhr.upload.onprogress = (e) => onProgress(e.loaded, e.total);
    xhr.onload = () => resolve(new Response(xhr.status === 204 ? null : xhr.responseText, {
      status: xhr.status,
      headers: Object.fromEntries(xhr.getAllResponseHeaders().trim().split(/\r?\n/).filter(Boolean)
        .map((line) => [line.slice(0, line.indexOf(":")), line.slice(line.indexOf(":") + 1).trim()])),
    }));
    xhr.onerror = () => reject(new TypeError("the upload failed: network error"));
    const abort = () => xhr.abort();
    init.signal?.addEventListener("abort", () => {
      abort();
      reject(init.signal!.reason);
    }, { once: true });
    xhr.send(init.body as XMLHttpRequestBodyInit);
  });
}

// Elsewhere (Node, Deno, Bun) a body streamed in chunks is counted as fetch reads it.
function counted(bytes: Uint8Array, onProgress: (sent: number, total: number) => void): () => ReadableStream<Uint8Array> {
  return () => {
    let sent = 0;
    return new ReadableStream<Uint8Array>({
      pull(controller) {
        if (sent >= bytes.length) {
          onProgress(sent, bytes.length);
          return controller.close();
        }
        const chunk = bytes.subarray(sent, sent + 65_536);
        sent += chunk.length;
        controller.enqueue(chunk);
        onProgress(sent, bytes.length);
      },
    });
  };
}

/**
 * A connection to the vidjobs API with one credential: an account's API key (`vj_…`), a platform key (`vjp_…`;
 * `platform` calls, and `actingFor` an account) or a browser token (`vjt_…`: what its scopes allow).
 *
 * ```ts
 * const vj = new Vidjobs({ baseUrl: "https://vidjobs.example", auth: process.env.VIDJOBS_API_KEY! });
 * const job = await vj.jobs.create({ model: "fake/default", prompt: "a red fox in snow" });
 * for await (const state of vj.jobs.follow(job.id)) console.log(state.stage);
 * ```
 */
export class Vidjobs extends Transport {
  constructor(options: ClientOptions) {
    super(options);
  }

  /** A client calling one of the platform's accounts' own routes (jobs, uploads, …) with this platform key. */
  actingFor(accountId: string): Vidjobs {
    return new Vidjobs({ ...this.options, accountId });
  }

  readonly jobs = {
    /** Create a render job. An idempotency key is made unless given, and every retry sends the same one, so a
     * create retried after a lost answer never makes a second job. */
    create: (body: T.CreateJob, o: Keyed = {}): Promise<Job> =>
      this.call("POST /v1/jobs", { ...o, body, headers: { "Idempotency-Key": o.idempotencyKey ?? newId("idem_", 16) } }),
    /** One job, as it stands. */
    get: (jobId: string, o?: RequestOptions): Promise<Job> =>
      this.call("GET /v1/jobs/{job_id}", { ...o, path: { job_id: jobId } }),
    /** One page of the account's jobs, newest first; pass `next_cursor` as `cursor` for the next. */
    list: (o: ListJobsOptions = {}): Promise<T.JobList> => {
      const { status, metadata, created_after, created_before, model, limit, cursor, ...rest } = o;
      const query: Record<string, string | number | null | undefined> = {
        status: Array.isArray(status) ? status.join(",") : status, model, limit, cursor,
        created_after: iso(created_after), created_before: iso(created_before),
      };
      for (const [key, value] of Object.entries(metadata ?? {})) query[`metadata.${key}`] = value;
      return this.call("GET /v1/jobs", { ...rest, query });
    },
    /** Every job that matches, newest first, fetching pages as they are needed. */
    iterate: (o: ListJobsOptions = {}): AsyncGenerator<Job> =>
      everyItem((cursor) => this.jobs.list({ ...o, cursor: cursor ?? o.cursor })),
    /** Cancel a job; one already ended is answered unchanged. */
    cancel: (jobId: string, o?: RequestOptions): Promise<Job> =>
      this.call("POST /v1/jobs/{job_id}/cancel", { ...o, path: { job_id: jobId } }),
    /** Delete a job; its files are removed in the background. */
    delete: (jobId: string, o?: RequestOptions): Promise<void> =>
      this.call("DELETE /v1/jobs/{job_id}", { ...o, path: { job_id: jobId } }),
    /** Render a job's request again as a new job (its `rerun_of` names the original); keyed as a create is. */
    rerun: (jobId: string, o: Keyed = {}): Promise<Job> =>
      this.call("POST /v1/jobs/{job_id}/rerun", {
        ...o, path: { job_id: jobId }, headers: { "Idempotency-Key": o.idempotencyKey ?? newId("idem_", 16) },
      }),
    /** Keep a ready job's clip past retention, counted against the account's storage quota. */
    keep: (jobId: string, o?: RequestOptions): Promise<Job> =>
      this.call("POST /v1/jobs/{job_id}/keep", { ...o, path: { job_id: jobId } }),
    /** Stop keeping the clip: retention counts from its completion again. */
    release: (jobId: string, o?: RequestOptions): Promise<Job> =>
      this.call("DELETE /v1/jobs/{job_id}/keep", { ...o, path: { job_id: jobId } }),
    /** Copy a ready job's stored original to `url`, a presigned PUT URL of your own bucket. The copy is made after
     * the answer (`status` pending); `waitExport` waits for it. Not retried once sent: the API takes no key here. */
    export: (jobId: string, url: string, o?: RequestOptions): Promise<Export> =>
      this.call("POST /v1/jobs/{job_id}/export", { ...o, path: { job_id: jobId }, body: { url }, replayable: false }),
    /** The job's exports, newest first. */
    exports: async (jobId: string, o?: RequestOptions): Promise<Export[]> =>
      (await this.call("GET /v1/jobs/{job_id}/exports", { ...o, path: { job_id: jobId } })).data,
    /** One export, as it stands: pending, done or failed. */
    getExport: (jobId: string, exportId: string, o?: RequestOptions): Promise<Export> =>
      this.call("GET /v1/jobs/{job_id}/exports/{export_id}", { ...o, path: { job_id: jobId, export_id: exportId } }),
    /** Ask about an export until it is done or failed (`reason` says why). */
    waitExport: (e: Export, o: RequestOptions & { waitTimeoutMs?: number } = {}): Promise<Export> =>
      poll(e, () => this.jobs.getExport(e.job_id, e.id, o), (x) => x.status !== "pending", o.waitTimeoutMs ?? 600_000,
        `export ${e.id} was still pending`, o.signal),
    /** The job's audit trail, oldest first. */
    events: async (jobId: string, o?: RequestOptions): Promise<T.TransitionOut[]> =>
      (await this.call("GET /v1/jobs/{job_id}/events", { ...o, path: { job_id: jobId } })).data,
    /** The job now and at every change until it ends, over its event stream, reconnecting by itself (a reconnect
     * reads the job again first, so its final state is never missed). */
    follow: (jobId: string, o?: FollowOptions): AsyncGenerator<Job, Job> => followJob(this, jobId, o),
    /** Follow the job until it ends, and return it as it ended. */
    wait: async (jobId: string, o: WaitOptions = {}): Promise<Job> => {
      for await (const job of followJob(this, jobId, o)) {
        o.onChange?.(job);
        if (isTerminal(job.status)) return job; // leaving the loop closes the stream
      }
      throw new Error("unreachable: following ends only at a terminal state");
    },
  };

  readonly uploads = {
    /** Upload a PNG, JPEG or WebP image; name its id as a job's `input_image`. By default this waits until the
     * server decoded it (`UploadRejectedError` if it refused it). Not retried once sent (a second upload is a
     * second image), but for the refusals that say nothing was taken (429, 503). */
    create: async (data: Bytes, o: UploadOptions = {}): Promise<Upload> => {
      const bytes = await bytesOf(data);
      const contentType = o.contentType ?? ((data as Blob).type || undefined);
      const progress = o.onProgress;
      const upload = await this.call("POST /v1/uploads", {
        ...o, contentType, replayable: false,
        makeBody: progress && typeof XMLHttpRequest === "undefined" ? counted(bytes, progress) : () => bytes,
        send: progress && typeof XMLHttpRequest !== "undefined" ? xhrSend(progress) : undefined,
      });
      return o.wait === false ? upload : this.uploads.wait(upload, o);
    },
    /** The upload as it stands: processing, ready or rejected (with `error`). */
    get: (uploadId: string, o?: RequestOptions): Promise<Upload> =>
      this.call("GET /v1/uploads/{upload_id}", { ...o, path: { upload_id: uploadId } }),
    /** The upload once decoded and ready; `UploadRejectedError` or `TimeoutError` otherwise. */
    wait: async (upload: Upload | string, o: UploadOptions = {}): Promise<Upload> => {
      const first = typeof upload === "string" ? await this.uploads.get(upload, o) : upload;
      const found = await poll(first, () => this.uploads.get(first.id, o), (u) => u.status !== "processing",
        o.waitTimeoutMs ?? 120_000, `upload ${first.id} was still processing`, o.signal);
      if (found.status === "rejected") {
        throw new UploadRejectedError(found.id, found.error?.code ?? "image_corrupt", found.error?.message ?? "rejected");
      }
      return found;
    },
  };

  readonly models = {
    /** The models this deployment renders with, what each takes and its price per second. */
    list: async (o?: RequestOptions): Promise<T.ModelOut[]> => (await this.call("GET /v1/models", o)).data,
  };

  readonly estimates = {
    /** What creating this job would reserve, checked as a create is, without creating anything. */
    create: (body: T.CreateJob, o?: RequestOptions): Promise<T.EstimateOut> =>
      this.call("POST /v1/estimates", { ...o, body }),
  };

  readonly account = {
    /** The account: credit, limits in force, jobs under way, storage. */
    get: (o?: RequestOptions): Promise<T.AccountOut> => this.call("GET /v1/account", o),
    /** Change the account's own settings (its default `fallback_models`). */
    update: (body: T.AccountPatch, o?: RequestOptions): Promise<T.AccountOut> =>
      this.call("PATCH /v1/account", { ...o, body }),
    /** One page of the credit ledger, newest first. */
    ledger: ({ limit, cursor, ...o }: PageOptions = {}): Promise<T.LedgerPage> =>
      this.call("GET /v1/account/ledger", { ...o, query: { limit, cursor } }),
    /** Jobs created in [from, to) grouped by `model`, `day` or `metadata.<key>`: statuses, credits, seconds. */
    usage: ({ group_by, from, to, ...o }: UsageOptions = {}): Promise<T.UsageReport> =>
      this.call("GET /v1/account/usage", { ...o, query: { group_by, from: iso(from), to: iso(to) } }),
  };

  readonly tokens = {
    /** A browser token for one of the account's people (read by default; 60-3600 s): shown in this answer only. */
    create: (body: T.NewToken = {}, o?: RequestOptions): Promise<T.TokenOut> =>
      this.call("POST /v1/account/tokens", { ...o, body, replayable: false }),
    /** What the browser token this client holds may do, and until when. */
    current: (o?: RequestOptions): Promise<T.TokenGrantOut> => this.call("GET /v1/token", o),
  };

  readonly webhooks = {
    /** Register an endpoint of your app; its `secret` is in this answer only. */
    create: (body: T.EndpointIn, o?: RequestOptions): Promise<T.EndpointCreated> =>
      this.call("POST /v1/webhook-endpoints", { ...o, body, replayable: false }),
    /** Your endpoints. */
    list: async (o?: RequestOptions): Promise<T.EndpointOut[]> =>
      (await this.call("GET /v1/webhook-endpoints", o)).data,
    /** Remove an endpoint; nothing more is sent to it. */
    delete: (endpointId: string, o?: RequestOptions): Promise<void> =>
      this.call("DELETE /v1/webhook-endpoints/{endpoint_id}", { ...o, path: { endpoint_id: endpointId } }),
    /** Replace an endpoint's secret; the old one signs too for `overlap_s` (default a day). Shown once. */
    rotateSecret: (endpointId: string, body: T.RotateSecretIn = {}, o?: RequestOptions): Promise<T.SecretIssued> =>
      this.call("POST /v1/webhook-endpoints/{endpoint_id}/rotate-secret", {
        ...o, path: { endpoint_id: endpointId }, body, replayable: false,
      }),
    /** One page of what was delivered to an endpoint, newest first, with the last attempts of each. */
    deliveries: (endpointId: string, { limit, cursor, ...o }: PageOptions = {}): Promise<T.DeliveryList> =>
      this.call("GET /v1/webhook-endpoints/{endpoint_id}/deliveries", {
        ...o, path: { endpoint_id: endpointId }, query: { limit, cursor },
      }),
    /** Everything delivered to an endpoint, newest first. */
    iterateDeliveries: (endpointId: string, o: PageOptions = {}): AsyncGenerator<T.DeliveryOut> =>
      everyItem((cursor) => this.webhooks.deliveries(endpointId, { ...o, cursor: cursor ?? o.cursor })),
    /** Send a delivery again now. */
    retryDelivery: (endpointId: string, deliveryId: string, o?: RequestOptions): Promise<void> =>
      this.call("POST /v1/webhook-endpoints/{endpoint_id}/deliveries/{delivery_id}/retry", {
        ...o, path: { endpoint_id: endpointId, delivery_id: deliveryId },
      }),
    /** When the secret signing deliveries to the `webhook_url` a job names was made (never the secret). */
    accountSecret: (o?: RequestOptions): Promise<T.WebhookSecretOut> => this.call("GET /v1/account/webhook-secret", o),
    /** Make the account's webhook secret, or replace it (the old one signs too for `overlap_s`). Shown once. */
    createAccountSecret: (body: T.RotateSecretIn = {}, o?: RequestOptions): Promise<T.SecretIssued> =>
      this.call("POST /v1/account/webhook-secret", { ...o, body, replayable: false }),
  };

  /** A product's backend managing its users' accounts, with a platform key (`vjp_…`). */
  readonly platform = {
    /** The key's platform and scopes. */
    whoami: (o?: RequestOptions): Promise<T.PlatformOut> => this.call("GET /v1/platform", o),
    /** The account of your user `external_id`: made now, or the one made for it before, unchanged. */
    createAccount: (body: T.CreatePlatformAccount, o?: RequestOptions): Promise<T.PlatformAccountOut> =>
      this.call("POST /v1/platform/accounts", { ...o, body }),
    getAccount: (accountId: string, o?: RequestOptions): Promise<T.PlatformAccountOut> =>
      this.call("GET /v1/platform/accounts/{account_id}", { ...o, path: { account_id: accountId } }),
    /** One page of your accounts, oldest first (`external_id`: only that user's). */
    listAccounts: ({ external_id, limit, cursor, ...o }: PageOptions & { external_id?: string } = {},
    ): Promise<T.PlatformAccountPage> =>
      this.call("GET /v1/platform/accounts", { ...o, query: { external_id, limit, cursor } }),
    /** Every account, oldest first. */
    iterateAccounts: (o: PageOptions & { external_id?: string } = {}): AsyncGenerator<T.PlatformAccountOut> =>
      everyItem((cursor) => this.platform.listAccounts({ ...o, cursor: cursor ?? o.cursor })),
    /** Change a name, a plan or limits (a limit given is the account's own; null clears a cap). */
    updateAccount: (accountId: string, body: T.PatchPlatformAccount, o?: RequestOptions): Promise<T.PlatformAccountOut> =>
      this.call("PATCH /v1/platform/accounts/{account_id}", { ...o, path: { account_id: accountId }, body }),
    /** Stop the account creating jobs: waiting ones are canceled, running ones finish (or `running: "stop"`). */
    disableAccount: (accountId: string, body: T.DisableAccount = {}, o?: RequestOptions): Promise<T.DisabledOut> =>
      this.call("POST /v1/platform/accounts/{account_id}/disable", { ...o, path: { account_id: accountId }, body }),
    enableAccount: (accountId: string, o?: RequestOptions): Promise<T.PlatformAccountOut> =>
      this.call("POST /v1/platform/accounts/{account_id}/enable", { ...o, path: { account_id: accountId } }),
    /** Close the account now (keys revoked, live jobs canceled); its data is then removed. */
    deleteAccount: (accountId: string, o?: RequestOptions): Promise<T.DeletedAccountOut> =>
      this.call("DELETE /v1/platform/accounts/{account_id}", { ...o, path: { account_id: accountId } }),
    /** Grant credit (`action: "grant"`) or take it back (`"take_back"`), once per `idempotency_key`. */
    changeCredits: (accountId: string, body: T.CreditChange, o?: RequestOptions): Promise<T.CreditChangeOut> =>
      this.call("POST /v1/platform/accounts/{account_id}/credits", { ...o, path: { account_id: accountId }, body }),
    ledger: (accountId: string, { limit, cursor, ...o }: PageOptions = {}): Promise<T.LedgerPage> =>
      this.call("GET /v1/platform/accounts/{account_id}/ledger", {
        ...o, path: { account_id: accountId }, query: { limit, cursor },
      }),
    usage: (accountId: string, { group_by, from, to, ...o }: UsageOptions = {}): Promise<T.UsageReport> =>
      this.call("GET /v1/platform/accounts/{account_id}/usage", {
        ...o, path: { account_id: accountId }, query: { group_by, from: iso(from), to: iso(to) },
      }),
    /** A new API key for an account: shown in this answer only. */
    createKey: (accountId: string, body: T.NewKey = {}, o?: RequestOptions): Promise<T.NewKeyOut> =>
      this.call("POST /v1/platform/accounts/{account_id}/keys", {
        ...o, path: { account_id: accountId }, body, replayable: false,
      }),
    listKeys: async (accountId: string, o?: RequestOptions): Promise<T.KeyOut[]> =>
      (await this.call("GET /v1/platform/accounts/{account_id}/keys", { ...o, path: { account_id: accountId } })).data,
    /** Revoke an account's API key (the browser tokens it minted die with it). */
    revokeKey: (accountId: string, keyId: string, o?: RequestOptions): Promise<void> =>
      this.call("DELETE /v1/platform/accounts/{account_id}/keys/{key_id}", {
        ...o, path: { account_id: accountId, key_id: keyId },
      }),
    /** A browser token for one of your accounts, for that person's page. */
    createToken: (accountId: string, body: T.NewToken = {}, o?: RequestOptions): Promise<T.TokenOut> =>
      this.call("POST /v1/platform/accounts/{account_id}/tokens", {
        ...o, path: { account_id: accountId }, body, replayable: false,
      }),
    /** Make or change a plan; every account on it takes its limits at once. */
    putPlan: (name: string, body: T.Plan, o?: RequestOptions): Promise<T.PlanOut> =>
      this.call("PUT /v1/platform/plans/{plan}", { ...o, path: { plan: name }, body }),
    listPlans: async (o?: RequestOptions): Promise<T.PlanOut[]> => (await this.call("GET /v1/platform/plans", o)).data,
    /** One page of what your platform keys changed, newest first. */
    audit: ({ account_id, limit, cursor, ...o }: PageOptions & { account_id?: string } = {}): Promise<T.AuditPage> =>
      this.call("GET /v1/platform/audit", { ...o, query: { account_id, limit, cursor } }),
    iterateAudit: (o: PageOptions & { account_id?: string } = {}): AsyncGenerator<T.AuditEntryOut> =>
      everyItem((cursor) => this.platform.audit({ ...o, cursor: cursor ?? o.cursor })),
  };
}
