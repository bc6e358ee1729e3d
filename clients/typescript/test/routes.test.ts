// Every route a product uses, through the client, against the real stack: jobs, uploads, models and estimates,
// the account, browser tokens, webhook endpoints with real deliveries verified, and the platform's calls.
import assert from "node:assert/strict";
import { createServer, type IncomingMessage } from "node:http";
import { after, before, describe, test } from "node:test";
import { ApiError, UploadRejectedError, verifyWebhook, type Job } from "@vidjobs/client";
import { Webhook } from "standardwebhooks";
import { client, env, freshAccount, hasStack, noisePng } from "./support.js";

const quick = { model: "fake/default", prompt: "a red fox in snow", duration_s: 1, params: { render_s: 0.2 } };

describe("routes", { skip: !hasStack && "no stack" }, () => {
  const vj = hasStack ? client() : (undefined as never);

  test("jobs: create with an idempotency key, get, list with paging and filters, events, cancel, delete, rerun", async () => {
    const key = `order-${Date.now()}`;
    const made = await vj.jobs.create({ ...quick, metadata: { order: key } }, { idempotencyKey: key });
    const again = await vj.jobs.create({ ...quick, metadata: { order: key } }, { idempotencyKey: key });
    assert.equal(again.id, made.id, "the same key answers the same job");
    assert.equal((await vj.jobs.get(made.id)).id, made.id);

    const hanging = await vj.jobs.create({ ...quick, params: { scenario: "hang" }, metadata: { order: key } });
    const first = await vj.jobs.list({ limit: 1, metadata: { order: key } });
    assert.equal(first.data.length, 1);
    assert.ok(first.next_cursor, "a second page");
    const second = await vj.jobs.list({ limit: 1, metadata: { order: key }, cursor: first.next_cursor });
    assert.deepEqual(new Set([first.data[0]!.id, second.data[0]!.id]), new Set([made.id, hanging.id]));
    const all: Job[] = [];
    for await (const job of vj.jobs.iterate({ limit: 1, metadata: { order: key } })) all.push(job);
    assert.deepEqual(all.map((j) => j.id), [first.data[0]!.id, second.data[0]!.id], "newest first, page by page");
    const filtered = await vj.jobs.list({ status: ["pending", "submitted", "processing"], model: "fake/default",
      created_after: new Date(Date.now() - 60_000), metadata: { order: key } });
    assert.ok(filtered.data.some((j) => j.id === hanging.id));

    const canceled = await vj.jobs.cancel(hanging.id);
    assert.equal(canceled.status, "canceled");
    assert.equal((await vj.jobs.cancel(hanging.id)).status, "canceled", "canceling twice is canceling once");
    const trail = await vj.jobs.events(hanging.id);
    assert.equal(trail.at(-1)!.to, "canceled");

    const rerun = await vj.jobs.rerun(hanging.id, { idempotencyKey: `${key}-rerun` });
    assert.equal(rerun.rerun_of, hanging.id);
    assert.equal((await vj.jobs.rerun(hanging.id, { idempotencyKey: `${key}-rerun` })).id, rerun.id);
    await vj.jobs.cancel(rerun.id);
    await vj.jobs.delete(rerun.id);
    await assert.rejects(vj.jobs.get(rerun.id), (e: unknown) =>
      e instanceof ApiError && e.status === 404 && e.code === "not_found" && !e.retryable && !!e.requestId);
  });

  test("a ready clip is kept, released and exported to the owner's URL", async () => {
    // The owner's bucket: a server taking the PUT of the presigned URL.
    const sink = env("VIDJOBS_EXPORT_URL");
    const stored = new Map<string, number>();
    const bucket = createServer((req, res) => {
      let bytes = 0;
      req.on("data", (c: Buffer) => (bytes += c.length));
      req.on("end", () => {
        stored.set(req.url!, bytes);
        res.writeHead(200).end();
      });
    });
    await new Promise<void>((resolve) => bucket.listen(Number(new URL(sink).port), "127.0.0.1", resolve));
    after(() => new Promise<void>((resolve) => bucket.close(() => resolve())));
    const done = await vj.jobs.wait((await vj.jobs.create(quick)).id, { timeoutMs: 60_000 });
    assert.equal(done.status, "completed");
    const kept = await vj.jobs.keep(done.id);
    assert.equal(kept.outputs!.kept, true);
    assert.equal((await vj.account.get()).storage.kept_jobs, 1);
    const released = await vj.jobs.release(done.id);
    assert.equal(released.outputs!.kept, false);
    const started = await vj.jobs.export(done.id, `${sink}/clips/${done.id}.mp4`);
    assert.equal(started.status, "pending");
    const ended = await vj.jobs.waitExport(started, { waitTimeoutMs: 30_000 });
    assert.equal(ended.status, "done", JSON.stringify(ended));
    assert.equal(ended.bytes, done.outputs!.bytes);
    assert.equal(stored.get(`/clips/${done.id}.mp4`), done.outputs!.bytes);
    assert.deepEqual((await vj.jobs.exports(done.id)).map((e) => e.id), [started.id]);
    assert.equal((await vj.jobs.getExport(done.id, started.id)).status, "done");
  });

  test("uploads report their progress and wait until the image is decoded; a refused one says why", async () => {
    const image = noisePng(200); // about 120 kB: several chunks
    const seen: number[] = [];
    const upload = await vj.uploads.create(image, { contentType: "image/png", onProgress: (sent) => seen.push(sent) });
    assert.equal(upload.status, "ready");
    assert.equal(upload.width, 200);
    assert.ok(seen.length >= 2 && seen.at(-1) === image.length, `progress ${seen}`);
    assert.equal((await vj.uploads.get(upload.id)).id, upload.id);
    const truncated = image.subarray(0, 5000);
    const refused = await vj.uploads.create(truncated, { contentType: "image/png" }).catch((e) => e);
    assert.ok(refused instanceof UploadRejectedError, String(refused));
    assert.equal(refused.code, "image_corrupt");
  });

  test("models, estimates, the account, its ledger and usage", async () => {
    const models = await vj.models.list();
    assert.ok(models.some((m) => m.id === "fake/default"));
    const estimate = await vj.estimates.create({ ...quick, duration_s: 4 });
    assert.ok(estimate.affordable && estimate.estimated_credits > 0);
    const account = await vj.account.get();
    assert.ok(account.credits.available > 0);
    const updated = await vj.account.update({ fallback_models: [] });
    assert.deepEqual(updated.fallback_models, []);
    const ledger = await vj.account.ledger({ limit: 2 });
    assert.ok(ledger.data.length > 0);
    const usage = await vj.account.usage({ group_by: "model", from: new Date(Date.now() - 3_600_000) });
    assert.ok(usage.data.some((g) => g.key === "fake/default"));
  });

  test("a browser token reads its grant and does only what its scopes allow", async () => {
    const minted = await vj.tokens.create({ scopes: ["read", "create"], ttl_s: 300, credit_ceiling: 10_000 });
    assert.match(minted.token, /^vjt_/);
    const browser = client(minted.token);
    const grant = await browser.tokens.current();
    assert.deepEqual([...grant.scopes].sort(), ["create", "read"]);
    const job = await browser.jobs.create(quick);
    assert.equal((await browser.jobs.wait(job.id, { timeoutMs: 60_000 })).status, "completed");
    await assert.rejects(browser.account.get(), (e: unknown) => e instanceof ApiError && e.status === 403);
  });

  describe("webhooks", () => {
    const path = `/hooks/${Date.now()}`; // this run's endpoint alone
    const deliveries: { headers: IncomingMessage["headers"]; body: Buffer }[] = [];
    const arrived: (() => void)[] = [];
    const server = createServer((req, res) => {
      const parts: Buffer[] = [];
      req.on("data", (c: Buffer) => parts.push(c));
      req.on("end", () => {
        if (req.url === path) deliveries.push({ headers: req.headers, body: Buffer.concat(parts) });
        res.writeHead(204).end();
        arrived.splice(0).forEach((f) => f());
      });
    });
    before(() => new Promise<void>((resolve) => server.listen(Number(env("VIDJOBS_HOOKS_PORT")), "127.0.0.1", resolve)));
    after(() => new Promise<void>((resolve) => server.close(() => resolve())));
    const next = async (count: number) => {
      const until = Date.now() + 30_000;
      while (deliveries.length < count && Date.now() < until) await new Promise<void>((r) => { arrived.push(r); setTimeout(r, 500); });
      assert.ok(deliveries.length >= count, `${count} deliveries expected, ${deliveries.length} arrived`);
      return deliveries[count - 1]!;
    };

    test("endpoints are made, rotated and deleted; real deliveries verify, with both secrets while rotating", async () => {
      const vj = await freshAccount(); // its deliveries are counted
      const url = `http://127.0.0.1:${env("VIDJOBS_HOOKS_PORT")}${path}`;
      const endpoint = await vj.webhooks.create({ url, events: ["job.completed"], description: "the app" });
      assert.match(endpoint.secret, /^whsec_/);
      assert.ok((await vj.webhooks.list()).some((e) => e.id === endpoint.id));

      const job = await vj.jobs.wait((await vj.jobs.create(quick)).id, { timeoutMs: 60_000 });
      const first = await next(1);
      const event = await verifyWebhook(endpoint.secret, first.headers as Record<string, string>, first.body);
      assert.equal(event.type, "job.completed");
      assert.equal(event.data.id, job.id);
      // The reference library agrees.
      new Webhook(endpoint.secret).verify(first.body.toString(), first.headers as Record<string, string>);

      const rotated = await vj.webhooks.rotateSecret(endpoint.id, { overlap_s: 3600 });
      await vj.jobs.wait((await vj.jobs.create(quick)).id, { timeoutMs: 60_000 });
      const second = await next(2);
      const signatures = String(second.headers["webhook-signature"]).split(" ");
      assert.equal(signatures.length, 2, "two signatures while the old secret overlaps");
      for (const secret of [endpoint.secret, rotated.secret]) {
        await verifyWebhook(secret, second.headers as Record<string, string>, second.body);
        new Webhook(secret).verify(second.body.toString(), second.headers as Record<string, string>);
      }
      await assert.rejects(verifyWebhook(endpoint.secret, second.headers as Record<string, string>,
        second.body.toString().replace('"job.completed"', '"job.failed"')), /no v1 signature/);

      const page = await vj.webhooks.deliveries(endpoint.id, { limit: 1 });
      assert.equal(page.data.length, 1);
      const every = [];
      for await (const d of vj.webhooks.iterateDeliveries(endpoint.id, { limit: 1 })) every.push(d);
      assert.equal(every.length, 2);
      await vj.webhooks.retryDelivery(endpoint.id, page.data[0]!.id);
      const resent = await next(3);
      assert.equal(resent.headers["webhook-id"], page.data[0]!.id, "a retry is the same message");
      await vj.webhooks.delete(endpoint.id);
      assert.ok(!(await vj.webhooks.list()).some((e) => e.id === endpoint.id));
    });

    test("the account's own secret is made once and described without being shown", async () => {
      const made = await vj.webhooks.createAccountSecret();
      assert.match(made.secret, /^whsec_/);
      const described = await vj.webhooks.accountSecret();
      assert.ok(!JSON.stringify(described).includes(made.secret));
    });
  });

  test("the platform: accounts, plans, credit, keys, tokens, acting for an account, its audit trail", async () => {
    const platform = client(env("VIDJOBS_PLATFORM_KEY"));
    const me = await platform.platform.whoami();
    assert.ok(me.scopes.includes("accounts"));
    const user = `user_${Date.now()}`;
    await platform.platform.putPlan("pro", { concurrent_jobs: 3 });
    assert.ok((await platform.platform.listPlans()).some((p) => p.name === "pro"));
    const made = await platform.platform.createAccount({ external_id: user, name: "Ada", plan: "pro" });
    assert.equal((await platform.platform.createAccount({ external_id: user })).id, made.id, "made once");
    assert.equal((await platform.platform.getAccount(made.id)).external_id, user);
    assert.deepEqual((await platform.platform.listAccounts({ external_id: user })).data.map((a) => a.id), [made.id]);
    const ids = [];
    for await (const a of platform.platform.iterateAccounts({ limit: 1 })) ids.push(a.id);
    assert.ok(ids.includes(made.id));
    assert.equal((await platform.platform.updateAccount(made.id, { max_job_credits: 500 })).limits.max_job_credits, 500);

    const grant = { action: "grant" as const, amount: 10_000, idempotency_key: `evt_${user}` };
    const granted = await platform.platform.changeCredits(made.id, grant);
    assert.equal((await platform.platform.changeCredits(made.id, grant)).replayed, true);
    await assert.rejects(platform.platform.changeCredits(made.id, { ...grant, amount: 5 }),
      (e: unknown) => e instanceof ApiError && e.status === 409 && e.code === "conflict");
    assert.equal(granted.credits.balance, 10_000);
    await platform.platform.changeCredits(made.id, { action: "take_back", amount: 1000, idempotency_key: `refund_${user}` });
    assert.ok((await platform.platform.ledger(made.id, { limit: 5 })).data.length >= 2);

    const acting = platform.actingFor(made.id);
    const job = await acting.jobs.create(quick);
    assert.equal((await acting.jobs.wait(job.id, { timeoutMs: 60_000 })).status, "completed");
    assert.ok((await platform.platform.usage(made.id, { group_by: "model" })).data.length >= 1);

    const key = await platform.platform.createKey(made.id, { name: "server" });
    assert.equal((await client(key.key).jobs.get(job.id)).id, job.id);
    assert.ok((await platform.platform.listKeys(made.id)).some((k) => k.id === key.id));
    await platform.platform.revokeKey(made.id, key.id);
    const token = await platform.platform.createToken(made.id, { scopes: ["read"], jobs: [job.id] });
    assert.equal((await client(token.token).jobs.get(job.id)).id, job.id);

    assert.equal((await platform.platform.disableAccount(made.id, { running: "stop" })).account.status, "disabled");
    await assert.rejects(acting.jobs.create(quick), (e: unknown) => e instanceof ApiError && e.code === "account_disabled");
    assert.equal((await platform.platform.enableAccount(made.id)).status, "active");
    assert.ok((await platform.platform.audit({ account_id: made.id, limit: 50 })).data.length > 3);
    let audited = 0;
    for await (const _ of platform.platform.iterateAudit({ account_id: made.id, limit: 5 })) audited++;
    assert.ok(audited > 3);
    assert.equal((await platform.platform.deleteAccount(made.id)).id, made.id);
  });
});
