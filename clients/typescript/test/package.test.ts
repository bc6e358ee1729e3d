// The package as a user gets it: `npm pack` makes a tarball that installs into an empty project, whose
// TypeScript compiles against the shipped declarations and renders a job against the real stack; and what a
// browser downloads (minified and gzipped) stays within its budget.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";
import { describe, test } from "node:test";
import { build } from "esbuild";
import { env, figure, hasStack } from "./support.js";

const PACKAGE = fileURLToPath(new URL("../..", import.meta.url));
// Bytes a browser downloads, minified and gzipped; React itself is the app's and not counted.
const BUDGET = { client: 8 * 1024, hooks: 5 * 1024 };

const APP = `
import { Vidjobs, type Job } from "@vidjobs/client";
import { verifyWebhook } from "@vidjobs/client/webhooks";

declare const process: { env: Record<string, string | undefined> }; // no Node types in this project
const vj = new Vidjobs({ baseUrl: process.env.VIDJOBS_URL, auth: process.env.VIDJOBS_API_KEY! });
const job: Job = await vj.jobs.create({ model: "fake/default", prompt: "a red fox in snow", duration_s: 1, params: { render_s: 0.2 } });
const stages: string[] = [];
const done = await vj.jobs.wait(job.id, { onChange: (j) => stages.push(j.stage) });
console.log(JSON.stringify({ status: done.status, stages, video: done.outputs?.video_url, verify: typeof verifyWebhook }));
`;

describe("the package", () => {
  test("npm pack makes a tarball that installs into an empty project, compiles and renders a job", { skip: !hasStack && "no stack" }, () => {
    const scratch = mkdtempSync(join(process.env.VIDJOBS_SCRATCH ? (mkdirSync(process.env.VIDJOBS_SCRATCH, { recursive: true }), process.env.VIDJOBS_SCRATCH) : tmpdir(), "pack-"));
    execFileSync("npm", ["pack", "--silent", "--pack-destination", scratch], { cwd: PACKAGE });
    const tarball = readdirSync(scratch).find((name) => name.endsWith(".tgz"))!;
    const listed = execFileSync("tar", ["-tzf", join(scratch, tarball)], { encoding: "utf8" }).split("\n");
    assert.ok(listed.includes("package/dist/index.js") && listed.includes("package/dist/index.d.ts")
      && listed.includes("package/dist/react.js") && listed.includes("package/README.md"), listed.join(" "));
    assert.ok(!listed.some((name) => name.includes("/test/") || name.includes("node_modules")), "only what users need");

    const app = join(scratch, "app");
    mkdirSync(app);
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
    // No dependency of its own to fetch: the tarball alone installs, offline.
    execFileSync("npm", ["install", "--offline", "--no-audit", "--no-fund", "--silent", join(scratch, tarball)], { cwd: app });
    writeFileSync(join(app, "main.ts"), APP);
    writeFileSync(join(app, "tsconfig.json"), JSON.stringify({
      compilerOptions: { target: "es2022", module: "nodenext", strict: true, lib: ["es2022", "dom"], types: [], skipLibCheck: false },
      files: ["main.ts"],
    }));
    // Its own TypeScript, strict, against the declarations shipped (React's types are not installed there:
    // only the hooks' entry needs them).
    try {
      execFileSync(join(PACKAGE, "node_modules", ".bin", "tsc"), ["-p", "."], { cwd: app, encoding: "utf8" });
    } catch (error) {
      assert.fail(`the app does not compile against the package: ${(error as { stdout: string }).stdout}`);
    }
    const out = JSON.parse(execFileSync("node", ["main.js"], {
      cwd: app, encoding: "utf8", env: { ...process.env, VIDJOBS_URL: env("VIDJOBS_URL") },
    }));
    assert.equal(out.status, "completed");
    assert.equal(out.stages.at(-1), "ready");
    assert.ok(out.video);
    assert.equal(out.verify, "function");
  });

  test("the client and the hooks stay within their size budget", async () => {
    const sizes: Record<string, { minified: number; gzipped: number }> = {};
    for (const [name, entry] of [["client", "index.js"], ["hooks", "react.js"], ["webhooks", "webhooks.js"]] as const) {
      const result = await build({
        entryPoints: [join(PACKAGE, "dist", entry)], bundle: true, minify: true, format: "esm", platform: "browser",
        external: ["react"], write: false, logLevel: "silent",
      });
      const code = result.outputFiles[0]!.contents;
      sizes[name] = { minified: code.length, gzipped: gzipSync(code, { level: 9 }).length };
    }
    figure("bundle_bytes", sizes);
    assert.ok(sizes.client!.gzipped <= BUDGET.client, `the client is ${sizes.client!.gzipped} B gzipped, over ${BUDGET.client}`);
    assert.ok(sizes.hooks!.gzipped <= BUDGET.hooks, `the hooks are ${sizes.hooks!.gzipped} B gzipped, over ${BUDGET.hooks}`);
  });
});
