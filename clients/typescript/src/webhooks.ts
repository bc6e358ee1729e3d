// Verifying the webhooks vidjobs sends (Standard Webhooks) with WebCrypto alone, so it runs wherever the app's
// webhook route runs: Node 20+, an edge function, a worker. A delivery carries `webhook-id`, `webhook-timestamp`
// (unix seconds of this attempt) and `webhook-signature`: one or more space-separated `v1,<base64 HMAC-SHA256 of
// "{id}.{timestamp}.{body}">`, two while a secret is being rotated. The body must be the raw bytes as received.
import { WebhookVerificationError } from "./errors.js";

export { WebhookVerificationError };
import type { JobOut } from "./types.gen.js";

/** What a delivery's body holds. */
export interface WebhookEvent {
  /** `job.completed`, `job.failed`, `job.canceled`, `job.stage`, `job.retrying`, `job.moved`, `job.expiring` */
  type: string;
  timestamp: string;
  /** the job as `GET /v1/jobs/{id}` shows it */
  data: JobOut;
}

export interface VerifyOptions {
  /** how far the timestamp may be from now, either way (default 300 s) */
  toleranceS?: number;
  /** now, in unix seconds (for tests) */
  now?: number;
}

type HeaderSource = Headers | Record<string, string | string[] | undefined>;
type Body = string | ArrayBuffer | ArrayBufferView;

const encoder = new TextEncoder();

function base64(bytes: Uint8Array): string {
  let text = "";
  for (const b of bytes) text += String.fromCharCode(b);
  return btoa(text);
}

/**
 * The key bytes of a secret, read as the gateway and the reference library read it: `whsec_` is optional, the
 * base64 may be padded, unpadded or over-padded, and whitespace (a mounted file's newline) is ignored. Text that
 * is not base64 is refused rather than turned into a key it does not say.
 */
export function decodeSecret(secret: string): Uint8Array {
  let text = secret.replace(/\s/g, "");
  if (text.startsWith("whsec_")) text = text.slice(6);
  text = text.replace(/=+$/, "");
  if (!/^[A-Za-z0-9+/]*$/.test(text)) {
    throw new TypeError("the webhook secret is not `whsec_` followed by base64 (A-Z, a-z, 0-9, + and /)");
  }
  if (text.length % 4 === 1) throw new TypeError("the webhook secret's base64 cannot be whole bytes");
  if (!text) throw new TypeError("the webhook secret is empty");
  return Uint8Array.from(atob(text + "=".repeat((4 - (text.length % 4)) % 4)), (c) => c.charCodeAt(0));
}

function header(headers: HeaderSource, name: string): string {
  let value: string | string[] | null | undefined;
  if (typeof (headers as Headers).get === "function") value = (headers as Headers).get(name);
  else {
    const found = Object.entries(headers).find(([key]) => key.toLowerCase() === name);
    value = found?.[1];
  }
  if (Array.isArray(value)) value = value.join(" ");
  if (!value) throw new WebhookVerificationError(`missing ${name} header`);
  return value;
}

function bytes(body: Body): Uint8Array {
  if (typeof body === "string") return encoder.encode(body);
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  return new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
}

function hmacKey(secret: string, usage: KeyUsage): Promise<CryptoKey> {
  return crypto.subtle.importKey("raw", decodeSecret(secret) as BufferSource, { name: "HMAC", hash: "SHA-256" },
    false, [usage]);
}

function signedContent(id: string, timestamp: number | string, body: Body): Uint8Array {
  const head = encoder.encode(`${id}.${timestamp}.`);
  const rest = bytes(body);
  const all = new Uint8Array(head.length + rest.length);
  all.set(head);
  all.set(rest, head.length);
  return all;
}

/** The `webhook-signature` value of a message: `v1,<base64>` for each secret, space-separated (to test a route). */
export async function signWebhook(secrets: string | string[], id: string, timestamp: number, body: Body): Promise<string> {
  const content = signedContent(id, timestamp, body);
  const signatures = [];
  for (const secret of [secrets].flat()) {
    const mac = await crypto.subtle.sign("HMAC", await hmacKey(secret, "sign"), content as BufferSource);
    signatures.push(`v1,${base64(new Uint8Array(mac))}`);
  }
  return signatures.join(" ");
}

/**
 * Check a delivery and return its event. `secrets`: the endpoint's secret, or several while you rotate it (any
 * one matching any signature is enough). Throws `WebhookVerificationError` (answer 400) for a missing header, a
 * timestamp outside the tolerance, or no matching signature. The comparison is WebCrypto's own (constant time).
 */
export async function verifyWebhook(secrets: string | string[], headers: HeaderSource, body: Body,
  options: VerifyOptions = {}): Promise<WebhookEvent & { id: string }> {
  const id = header(headers, "webhook-id");
  const stamp = header(headers, "webhook-timestamp");
  if (!/^\d+$/.test(stamp)) throw new WebhookVerificationError("webhook-timestamp is not unix seconds");
  const skew = (options.now ?? Date.now() / 1000) - Number(stamp);
  const tolerance = options.toleranceS ?? 300;
  if (Math.abs(skew) > tolerance) {
    throw new WebhookVerificationError(`webhook-timestamp is ${Math.round(Math.abs(skew))} s ${skew > 0 ? "old" : "ahead"}, beyond the ${tolerance} s tolerance`);
  }
  const content = signedContent(id, stamp, body);
  const offered = header(headers, "webhook-signature").split(" ").filter((s) => s.startsWith("v1,"));
  for (const secret of [secrets].flat()) {
    const key = await hmacKey(secret, "verify");
    for (const signature of offered) {
      let mac: Uint8Array;
      try {
        mac = Uint8Array.from(atob(signature.slice(3)), (c) => c.charCodeAt(0));
      } catch {
        continue; // not base64: matches nothing
      }
      if (await crypto.subtle.verify("HMAC", key, mac as BufferSource, content as BufferSource)) {
        return { id, ...(JSON.parse(new TextDecoder().decode(bytes(body))) as WebhookEvent) };
      }
    }
  }
  throw new WebhookVerificationError("no v1 signature in webhook-signature matches the body");
}
