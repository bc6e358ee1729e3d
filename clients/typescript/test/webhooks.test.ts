// The webhook helper against the reference implementation (the standardwebhooks package), both ways: what it
// signs verifies there, what that signs verifies here; every form of secret the gateway accepts; the timestamp's
// tolerance either way; several signatures during a rotation; and what must be refused.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { describe, test } from "node:test";
import { decodeSecret, signWebhook, verifyWebhook, WebhookVerificationError } from "@vidjobs/client/webhooks";
import { Webhook } from "standardwebhooks";

const body = JSON.stringify({ type: "job.completed", timestamp: "2026-01-01T00:00:00Z", data: { id: "job_1", status: "completed" } });
const newSecret = () => `whsec_${randomBytes(32).toString("base64")}`;
const now = () => Math.floor(Date.now() / 1000);

function headers(id: string, timestamp: number, signature: string): Record<string, string> {
  return { "webhook-id": id, "webhook-timestamp": String(timestamp), "webhook-signature": signature };
}

describe("webhooks", () => {
  test("signed here, verified by standardwebhooks; signed there, verified here", async () => {
    const secret = newSecret();
    const ts = now();
    const ours = await signWebhook(secret, "msg_1", ts, body);
    assert.deepEqual(new Webhook(secret).verify(body, headers("msg_1", ts, ours)), JSON.parse(body));
    const theirs = new Webhook(secret).sign("msg_2", new Date(ts * 1000), body);
    assert.equal(theirs, await signWebhook(secret, "msg_2", ts, body), "the same signature");
    const event = await verifyWebhook(secret, headers("msg_2", ts, theirs), body);
    assert.equal(event.id, "msg_2");
    assert.equal(event.data.id, "job_1");
    // Bytes and a Headers object, as a route handler has them.
    const bytes = new TextEncoder().encode(body);
    await verifyWebhook(secret, new Headers(headers("msg_2", ts, theirs)), bytes);
  });

  test("every form of secret the gateway accepts gives the same key", async () => {
    const raw = randomBytes(24); // base64 with no padding
    const odd = randomBytes(32); // base64 with one =
    const forms = [
      [`whsec_${raw.toString("base64")}`, raw],
      [raw.toString("base64"), raw], // no prefix
      [`whsec_${odd.toString("base64")}`, odd],
      [`whsec_${odd.toString("base64").replace(/=+$/, "")}`, odd], // padding left out
      [`whsec_${odd.toString("base64")}==`, odd], // over-padded
      [`  whsec_${odd.toString("base64")}\n`, odd], // a mounted file's whitespace
    ] as const;
    for (const [text, key] of forms) {
      assert.deepEqual(Buffer.from(decodeSecret(text)), key, text);
      // Both ways against the reference library holding the same key written canonically (the npm package
      // insists on exact padding, where the gateway reads a secret as the Python package does).
      const reference = new Webhook(`whsec_${key.toString("base64")}`);
      const ts = now();
      await verifyWebhook(text, headers("msg_f", ts, reference.sign("msg_f", new Date(ts * 1000), body)), body);
      reference.verify(body, headers("msg_f", ts, await signWebhook(text, "msg_f", ts, body)));
    }
    for (const bad of ["whsec_", "whsec_abc-def_", "whsec_A", "WHSEC_abcd"]) {
      assert.throws(() => decodeSecret(bad), TypeError, bad);
    }
  });

  test("the timestamp must be within the tolerance, either way", async () => {
    const secret = newSecret();
    for (const [offset, ok] of [[-299, true], [299, true], [-301, false], [301, false]] as const) {
      const ts = now() + offset;
      const signed = headers("msg_t", ts, await signWebhook(secret, "msg_t", ts, body));
      if (ok) await verifyWebhook(secret, signed, body);
      else await assert.rejects(verifyWebhook(secret, signed, body), /tolerance/);
      // standardwebhooks agrees (its tolerance is five minutes too).
      if (ok) new Webhook(secret).verify(body, signed);
      else assert.throws(() => new Webhook(secret).verify(body, signed));
    }
    const ts = now() - 3600;
    const old = headers("msg_t", ts, await signWebhook(secret, "msg_t", ts, body));
    await verifyWebhook(secret, old, body, { toleranceS: 7200 });
  });

  test("during a rotation either secret verifies; a receiver may hold both", async () => {
    const [old, fresh] = [newSecret(), newSecret()];
    const ts = now();
    const both = await signWebhook([fresh, old], "msg_r", ts, body);
    assert.equal(both.split(" ").length, 2);
    for (const secret of [old, fresh]) {
      await verifyWebhook(secret, headers("msg_r", ts, both), body);
      new Webhook(secret).verify(body, headers("msg_r", ts, both));
    }
    // Signed with the new one only, a receiver still holding both verifies it.
    const onlyNew = await signWebhook(fresh, "msg_r", ts, body);
    await verifyWebhook([old, fresh], headers("msg_r", ts, onlyNew), body);
    await assert.rejects(verifyWebhook(old, headers("msg_r", ts, onlyNew), body), WebhookVerificationError);
  });

  test("a changed body, id or signature, or a missing header, is refused", async () => {
    const secret = newSecret();
    const ts = now();
    const signature = await signWebhook(secret, "msg_x", ts, body);
    const refused = async (h: Record<string, string>, b = body, pattern: RegExp = /no v1 signature/) =>
      assert.rejects(verifyWebhook(secret, h, b), (e: unknown) => e instanceof WebhookVerificationError && pattern.test((e as Error).message));
    await refused(headers("msg_x", ts, signature), body.replace("job_1", "job_2"));
    await refused(headers("msg_y", ts, signature));
    await refused(headers("msg_x", ts, signature.replace("v1,", "v2,")));
    await refused(headers("msg_x", ts, "v1,not*base64"));
    await refused(headers("msg_x", ts, await signWebhook(newSecret(), "msg_x", ts, body)));
    await refused({ "webhook-id": "msg_x", "webhook-signature": signature }, body, /missing webhook-timestamp/);
    await refused(headers("msg_x", ts, ""), body, /missing webhook-signature/);
    await refused({ ...headers("msg_x", ts, signature), "webhook-timestamp": "12.5" }, body, /unix seconds/);
  });
});
