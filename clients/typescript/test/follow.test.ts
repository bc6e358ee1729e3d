// Following a job live against the real stack: to completion with its stages in order, as `wait`, through a
// connection cut mid-job (by a proxy between the client and the gateway) that still ends at the final state,
// and stopped by the caller's signal or its timeout.
import assert from "node:assert/strict";
import { connect, createServer, type Server, type Socket } from "node:net";
import { describe, test } from "node:test";
import { TimeoutError, type Job, type ReconnectInfo } from "@vidjobs/client";
import { BASE_URL, client, figure, hasStack, inOrder } from "./support.js";

/** A TCP proxy to the gateway that can cut every connection through it, and refuse new ones for a while. */
class CuttingProxy {
  private readonly server: Server;
  private readonly sockets = new Set<Socket>();
  refusing = false;

  constructor(target: URL) {
    this.server = createServer((inbound) => {
      if (this.refusing) return void inbound.destroy();
      const outbound = connect(Number(target.port), target.hostname);
      for (const s of [inbound, outbound]) {
        this.sockets.add(s);
        s.on("close", () => this.sockets.delete(s));
        s.on("error", () => {});
      }
      inbound.pipe(outbound).pipe(inbound);
      inbound.on("close", () => outbound.destroy());
      outbound.on("close", () => inbound.destroy());
    });
  }

  listen(): Promise<string> {
    return new Promise((resolve) => this.server.listen(0, "127.0.0.1", () => {
      const address = this.server.address() as { port: number };
      resolve(`http://127.0.0.1:${address.port}`);
    }));
  }

  cut(): void {
    for (const s of this.sockets) s.destroy();
  }

  close(): Promise<void> {
    this.cut();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}

const render = (seconds: number) => ({ model: "fake/default", prompt: "a slow fox", duration_s: 1, params: { render_s: seconds } });

describe("follow", { skip: !hasStack && "no stack" }, () => {
  const vj = hasStack ? client() : (undefined as never);

  test("a job is followed from queued to ready, each change delivered as it happens", async () => {
    const job = await vj.jobs.create(render(1));
    const stages: string[] = [];
    const lateness: number[] = [];
    let last: Job | undefined;
    for await (const state of vj.jobs.follow(job.id, { timeoutMs: 60_000 })) {
      // The event's id is the job's updated_at in ms: how long after the change the client had it.
      if (stages.length > 0) lateness.push(Date.now() - Date.parse(state.updated_at));
      stages.push(state.stage);
      last = state;
    }
    assert.ok(inOrder(stages), stages.join(" "));
    assert.equal(last!.status, "completed");
    assert.ok(last!.outputs!.video_url);
    figure("follow_delivery_ms", lateness);
  });

  test("wait returns the job as it ended and shows every state on the way", async () => {
    const job = await vj.jobs.create(render(0.3));
    const seen: string[] = [];
    const lateness: number[] = [];
    const ended = await vj.jobs.wait(job.id, { timeoutMs: 60_000, onChange: (j) => {
      if (seen.length > 0) lateness.push(Date.now() - Date.parse(j.updated_at));
      seen.push(j.stage);
    } });
    figure("wait_delivery_ms", lateness);
    assert.equal(ended.status, "completed");
    assert.ok(inOrder(seen), seen.join(" "));
    const failed = await vj.jobs.wait((await vj.jobs.create({ ...render(0.1), params: { scenario: "content_rejected" } })).id);
    assert.equal(failed.status, "failed");
    assert.equal(failed.error!.code, "content_rejected");
  });

  test("a stream cut mid-job, and refused until the job has ended, still ends at the final state", async () => {
    const proxy = new CuttingProxy(new URL(BASE_URL));
    const through = client(undefined, { baseUrl: await proxy.listen(), retry: { backoffMs: 200, maxBackoffMs: 1000 } });
    try {
      const job = await vj.jobs.create(render(1));
      const reconnects: ReconnectInfo[] = [];
      const stages: string[] = [];
      let last: Job | undefined;
      for await (const state of through.jobs.follow(job.id, { timeoutMs: 60_000, onReconnect: (r) => reconnects.push(r) })) {
        stages.push(state.stage);
        last = state;
        if (stages.length === 1) {
          proxy.refusing = true;
          proxy.cut();
          // Nothing gets through until the job has ended: no stream can show the last changes.
          const ended = await vj.jobs.wait(job.id, { timeoutMs: 60_000 });
          assert.equal(ended.status, "completed");
          proxy.refusing = false;
        }
      }
      assert.ok(reconnects.length >= 1, "it reconnected");
      assert.equal(last!.status, "completed");
      assert.equal(last!.stage, "ready");
      assert.equal(new Set(stages).size, stages.length, `no state shown twice: ${stages}`);
      figure("reconnects_after_cut", reconnects.length);

      // Cut again mid-render, this time letting it straight back: the new stream carries on to the end.
      const next = await vj.jobs.create(render(1));
      const again: string[] = [];
      let cut = false;
      for await (const state of through.jobs.follow(next.id, { timeoutMs: 60_000 })) {
        again.push(state.stage);
        if (!cut && state.stage === "rendering") {
          cut = true;
          proxy.cut();
        }
      }
      assert.ok(cut && inOrder(again), again.join(" "));
    } finally {
      await proxy.close();
    }
  });

  test("the caller's signal stops following, and a timeout says so", async () => {
    const job = await vj.jobs.create({ ...render(1), params: { scenario: "hang" } });
    const controller = new AbortController();
    const states = vj.jobs.follow(job.id, { signal: controller.signal });
    assert.equal((await states.next()).value!.id, job.id);
    setTimeout(() => controller.abort(new Error("the person left")), 300);
    await assert.rejects(async () => {
      for (;;) if ((await states.next()).done) return;
    }, /the person left/);
    await assert.rejects(vj.jobs.wait(job.id, { timeoutMs: 300 }), TimeoutError);
    await vj.jobs.cancel(job.id);
  });
});
