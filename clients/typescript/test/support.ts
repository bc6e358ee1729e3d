// What the tests share: the stack they run against (named by tests/test_typescript_client.py in the
// environment), clients that record every route the API answered, and small images made in memory.
import { appendFileSync } from "node:fs";
import { deflateSync } from "node:zlib";
import { Vidjobs, type ClientOptions } from "@vidjobs/client";

export const env = (name: string): string => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run these tests through tests/test_typescript_client.py`);
  return value;
};

export const BASE_URL = process.env.VIDJOBS_URL ?? "";
export const hasStack = BASE_URL !== "";

/** Each answer as `METHOD /route status`, for the test that holds the client to every route of the document. */
export function record(route: string, status: number): void {
  if (process.env.VIDJOBS_ROUTES_FILE) appendFileSync(process.env.VIDJOBS_ROUTES_FILE, `${route} ${status}\n`);
}

/** A figure for the report, as a JSON line. */
export function figure(name: string, value: unknown): void {
  if (process.env.VIDJOBS_FIGURES_FILE) appendFileSync(process.env.VIDJOBS_FIGURES_FILE, JSON.stringify({ name, value }) + "\n");
}

export function client(auth = env("VIDJOBS_API_KEY"), more: Partial<ClientOptions> = {}): Vidjobs {
  return new Vidjobs({
    baseUrl: BASE_URL, auth, ...more,
    onResponse: (info) => {
      record(info.route, info.status);
      more.onResponse?.(info);
    },
  });
}

const CRC = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});

function crc32(data: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of data) c = CRC[(c ^ b) & 0xff]! ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

function chunk(type: string, data: Uint8Array): Buffer {
  const head = Buffer.alloc(8);
  head.writeUInt32BE(data.length, 0);
  head.write(type, 4, "ascii");
  const tail = Buffer.alloc(4);
  tail.writeUInt32BE(crc32(Buffer.concat([head.subarray(4), data])), 0);
  return Buffer.concat([head, data, tail]);
}

/** A PNG of `side` x `side` pixels of noise (it does not compress: its bytes are about side² x 3). */
export function noisePng(side: number): Uint8Array {
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(side, 0);
  ihdr.writeUInt32BE(side, 4);
  ihdr.set([8, 2, 0, 0, 0], 8); // 8-bit RGB
  const raw = Buffer.alloc(side * (side * 3 + 1));
  for (let y = 0; y < side; y++) {
    raw[y * (side * 3 + 1)] = 0;
    for (let x = 1; x <= side * 3; x++) raw[y * (side * 3 + 1) + x] = Math.floor(Math.random() * 256);
  }
  return Buffer.concat([Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]), chunk("IHDR", ihdr),
    chunk("IDAT", deflateSync(raw)), chunk("IEND", new Uint8Array())]);
}

export const STAGES = ["queued", "submitted", "rendering", "downloading", "ready"];

/** Whether stages only moved forward and ended ready. */
export function inOrder(stages: string[]): boolean {
  const at = stages.map((s) => STAGES.indexOf(s));
  return at.every((p, i) => p >= 0 && (i === 0 || p >= at[i - 1]!)) && stages.at(-1) === "ready";
}

/** A client of a new account of its own (made with the platform key), for a test that counts what its account
 * does while other tests run beside it. */
export async function freshAccount(credits = 1_000_000): Promise<Vidjobs> {
  const platform = client(env("VIDJOBS_PLATFORM_KEY"));
  const user = `user_${Date.now()}_${Math.random().toString(16).slice(2, 8)}`;
  const account = await platform.platform.createAccount({ external_id: user, concurrent_jobs: 8 });
  await platform.platform.changeCredits(account.id, { action: "grant", amount: credits, idempotency_key: `open_${user}` });
  return client((await platform.platform.createKey(account.id, { name: "tests" })).key);
}
