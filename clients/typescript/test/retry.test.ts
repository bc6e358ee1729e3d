// Retries and errors against the real stack: a 429 waited out as Retry-After says and sent again with the same
// idempotency key and request id; typed errors carrying the API's code, message, request id and retryable; a
// connection that cannot be made, an answer that never comes, and a caller's abort.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { describe, test } from "node:test";
import { ApiError, ConnectionError, TimeoutError, type RetryInfo } from "@vidjobs/client";
import { client, env, hasStack } from "./support.js";

const quick = { model: "fake/default", prompt: "a red fox", duration_s: 1, params: { render_s: 0.1 } };

describe("retries and errors", { skip: !hasStack && "no stack" }, () => {
  test("a 429 is waited out as Retry-After says, with the same idempotency key", async () => {
    const sent: { status: number; key: string | undefined; requestId: string }[] = [];
    const retries: RetryInfo[] = [];
    const slow = client(env("VIDJOBS_SLOW_KEY"), {
      onRetry: (r) => retries.push(r),
      fetch: async (url, init) => {
        const resp = await fetch(url, init);
        const headers = init!.headers as Record<string, string>;
        sent.push({ status: resp.status, key: headers["Idempotency-Key"], requestId: headers["X-Request-Id"]! });
        return resp;
      },
    });
    await slow.models.list(); // the account's one request of its burst
    const started = Date.now();
    const job = await slow.jobs.create(quick);
    const creates = sent.filter((s) => s.key !== undefined);
    assert.ok(creates.length >= 2, JSON.stringify(sent));
    assert.equal(creates[0]!.status, 429);
    assert.equal(creates.at(-1)!.status, 201);
    assert.equal(new Set(creates.map((c) => c.key)).size, 1, "one idempotency key for every try");
    assert.equal(new Set(creates.map((c) => c.requestId)).size, 1, "one request id for every try");
    const rateLimited = retries.filter((r) => r.route === "POST /v1/jobs");
    assert.equal(rateLimited[0]!.reason, "rate_limited");
    assert.ok(Date.now() - started >= rateLimited[0]!.waitMs - 50, "it waited as long as Retry-After said");
    const listed = await slow.jobs.list();
    assert.deepEqual(listed.data.map((j) => j.id), [job.id], "one job made");

    const impatient = client(env("VIDJOBS_SLOW_KEY"), { retry: { attempts: 1 } });
    const refusal = await (async () => {
      for (let i = 0; i < 5; i++) await impatient.jobs.get(job.id);
    })().catch((e) => e);
    assert.ok(refusal instanceof ApiError, String(refusal));
    assert.equal(refusal.status, 429);
    assert.equal(refusal.code, "rate_limited");
    assert.ok(refusal.retryable && refusal.retryAfterMs! > 0 && refusal.requestId);
  });

  test("errors carry the API's code, message, request id and whether to retry", async () => {
    const vj = client();
    const bad = await vj.jobs.create({ ...quick, duration_s: 600 }).catch((e) => e);
    assert.ok(bad instanceof ApiError);
    assert.equal(bad.status, 422);
    assert.equal(bad.code, "invalid_input");
    assert.match(bad.message, /duration_s/);
    assert.equal(bad.retryable, false);
    assert.match(bad.requestId!, /^req_/);
    assert.ok(bad.message.includes(bad.requestId!));
    const stranger = await client("vj_not_a_key").account.get().catch((e) => e);
    assert.ok(stranger instanceof ApiError && stranger.status === 401 && stranger.code === "unauthorized");
  });

  test("a connection that cannot be made fails after the policy's tries; an answer that never comes times out", async () => {
    const retries: RetryInfo[] = [];
    const server = createServer(() => {}); // takes the request and never answers
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const port = (server.address() as { port: number }).port;
    try {
      const mute = client("vj_any", { baseUrl: `http://127.0.0.1:${port}`, timeoutMs: 200,
        retry: { attempts: 2, backoffMs: 10 }, onRetry: (r) => retries.push(r) });
      await assert.rejects(mute.jobs.get("job_x"), (e: unknown) => e instanceof TimeoutError && /2 tries/.test(e.message));
      assert.deepEqual(retries.map((r) => r.reason), ["timeout"]);
      // Sent once and not answered, an upload is not sent again: it could be a second image.
      await assert.rejects(mute.uploads.create(new Uint8Array(10)), (e: unknown) => e instanceof TimeoutError && /1 try/.test(e.message));
      // The caller's own signal ends a call at once, with its reason.
      await assert.rejects(mute.jobs.get("job_x", { signal: AbortSignal.timeout(50), timeoutMs: 5000 }),
        (e: unknown) => (e as Error).name === "TimeoutError" && !(e instanceof TimeoutError));
    } finally {
      server.closeAllConnections();
      server.close();
    }
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, "127.0.0.1", resolve));
    const gone = (closed.address() as { port: number }).port;
    closed.close();
    retries.length = 0;
    const nowhere = client("vj_any", { baseUrl: `http://127.0.0.1:${gone}`, retry: { backoffMs: 10 }, onRetry: (r) => retries.push(r) });
    // Never sent, so even an upload is tried again.
    await assert.rejects(nowhere.uploads.create(new Uint8Array(10)), (e: unknown) => e instanceof ConnectionError && /4 tries/.test(e.message));
    assert.equal(retries.length, 3);
    assert.match(retries[0]!.reason, /ECONNREFUSED/);
  });
});
