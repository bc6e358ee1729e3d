// The vidjobs page: submit a render and follow it live. The server owns the job; this page only shows it,
// so closing the tab loses nothing: on return it reads the job's current state and follows it again.
//
// Progress comes over GET /v1/jobs/{id}/stream (Server-Sent Events). EventSource cannot send an
// Authorization header, and putting the key in the URL would leak it into logs and history, so the stream
// is read with fetch() and parsed here.
"use strict";

const STAGES = ["queued", "submitted", "rendering", "downloading", "ready"];
const TERMINAL = new Set(["completed", "failed", "canceled", "expired"]);
const KEY_STORE = "vidjobs.key";
const JOB_STORE = "vidjobs.job";

const $ = (id) => document.getElementById(id);
let following = null; // AbortController of the stream being read
let pendingCreate = null; // {body, key}: a retried press of Render reuses its Idempotency-Key

class ApiError extends Error {
  constructor(status, body) {
    super(body?.error?.message || `HTTP ${status}`);
    this.status = status;
    this.code = body?.error?.code;
  }
}

function apiKey() {
  return localStorage.getItem(KEY_STORE) || "";
}

async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${apiKey()}`, ...(options.headers || {}) };
  const resp = await fetch(path, { ...options, headers });
  if (resp.status === 204) return null;
  const body = await resp.json().catch(() => null);
  if (!resp.ok) throw new ApiError(resp.status, body);
  return body;
}

function randomKey() {
  if (crypto.randomUUID) return crypto.randomUUID();
  // randomUUID needs a secure context; getRandomValues does not.
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}

function explain(err) {
  if (err instanceof ApiError && err.status === 401) return "The API key was not accepted. Check it above.";
  return err.message || String(err);
}

// ---- the current job ----------------------------------------------------------------------------------

function renderStages(job) {
  const reached = STAGES.indexOf(job.stage);
  for (const li of $("stages").children) {
    const i = STAGES.indexOf(li.dataset.stage);
    li.classList.toggle("done", reached >= 0 && i < reached);
    li.classList.toggle("current", i === reached);
    li.classList.toggle("stopped", reached < 0);
  }
}

function statusLine(job) {
  const parts = [`${job.stage}`];
  if (job.status === "pending" && job.queue_position) parts.push(`number ${job.queue_position} in your queue`);
  if (job.status === "pending" && job.queue_reason) parts.push(job.queue_reason);
  if (job.progress !== null && job.progress !== undefined) parts.push(`${Math.round(job.progress * 100)}% (as reported by the provider)`);
  if (job.attempt > 1) parts.push(`attempt ${job.attempt}`);
  if (job.status === "retrying" && job.error) parts.push(`retrying after: ${job.error.message}`);
  parts.push(`updated ${new Date(job.updated_at).toLocaleTimeString()}`);
  return parts.join(" · ");
}

function renderResult(job) {
  const out = job.outputs;
  $("result").hidden = !out;
  if (!out) {
    $("video").removeAttribute("src");
    return;
  }
  if ($("video").getAttribute("src") !== out.video_url) {
    $("video").src = out.video_url;
    $("video").poster = out.thumbnail_url;
    $("thumbnail").src = out.thumbnail_url;
  }
  const mb = (out.bytes / 1e6).toFixed(2);
  $("result-meta").textContent = `${out.width}×${out.height}, ${out.duration_s.toFixed(1)} s, ${mb} MB. ` +
    `Links valid until ${new Date(out.expires_at).toLocaleString()}.`;
}

function renderJob(job) {
  $("job").hidden = false;
  $("job-title").textContent = job.id;
  $("job-prompt").textContent = job.prompt;
  renderStages(job);
  $("job-status").textContent = statusLine(job);
  const failed = ["failed", "canceled", "expired"].includes(job.status);
  $("job-error").textContent = failed && job.error ? job.error.message : failed ? job.status : "";
  $("cancel").hidden = TERMINAL.has(job.status);
  renderResult(job);
  markInList(job);
}

function showGone(jobId) {
  $("job-title").textContent = jobId;
  $("job-status").textContent = "";
  $("job-error").textContent = "This job no longer exists (deleted, or it belongs to another key).";
  $("cancel").hidden = true;
  $("result").hidden = true;
  localStorage.removeItem(JOB_STORE);
}

// ---- following a job over Server-Sent Events --------------------------------------------------------

function parseEvents(buffer, onEvent) {
  // Events end with a blank line; a trailing partial event stays in the buffer for the next chunk.
  const blocks = buffer.split(/\r?\n\r?\n/);
  const rest = blocks.pop();
  for (const block of blocks) {
    let name = "message";
    const data = [];
    for (const line of block.split(/\r?\n/)) {
      if (line.startsWith(":")) continue; // keepalive comment
      const [field, ...value] = line.split(":");
      const text = value.join(":").replace(/^ /, "");
      if (field === "event") name = text;
      else if (field === "data") data.push(text);
    }
    if (data.length) onEvent(name, data.join("\n"));
  }
  return rest;
}

async function readStream(jobId, signal) {
  const resp = await fetch(`/v1/jobs/${encodeURIComponent(jobId)}/stream`, {
    headers: { Authorization: `Bearer ${apiKey()}`, Accept: "text/event-stream" },
    signal,
  });
  if (!resp.ok) throw new ApiError(resp.status, await resp.json().catch(() => null));
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let last = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return last;
    buffer = parseEvents(buffer + value, (name, data) => {
      if (name !== "job") return;
      last = JSON.parse(data);
      renderJob(last);
    });
  }
}

async function follow(jobId) {
  if (following) following.abort();
  const controller = new AbortController();
  following = controller;
  localStorage.setItem(JOB_STORE, jobId);
  let delay = 1000;
  while (!controller.signal.aborted) {
    try {
      const last = await readStream(jobId, controller.signal);
      if (last && TERMINAL.has(last.status)) return refreshList();
      // The stream ended early (server restart, or the job was deleted): look before reconnecting.
      renderJob(await api(`/v1/jobs/${encodeURIComponent(jobId)}`));
      delay = 1000;
    } catch (err) {
      if (controller.signal.aborted) return;
      if (err instanceof ApiError && err.status === 404) return showGone(jobId);
      if (err instanceof ApiError && err.status === 401) {
        $("job-error").textContent = explain(err);
        return;
      }
      $("job-status").textContent = `connection lost; reconnecting in ${delay / 1000} s`;
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 15000);
    }
  }
}

// ---- recent jobs and the account ---------------------------------------------------------------------

function markInList(job) {
  const li = document.querySelector(`#jobs li[data-id="${CSS.escape(job.id)}"]`);
  if (!li) return;
  li.querySelector(".badge").textContent = job.stage;
  li.querySelector(".badge").dataset.stage = job.stage;
}

function listItem(job) {
  const li = document.createElement("li");
  li.dataset.id = job.id;
  const badge = document.createElement("span");
  badge.className = "badge";
  badge.textContent = job.stage;
  badge.dataset.stage = job.stage;
  const prompt = document.createElement("span");
  prompt.className = "prompt";
  prompt.textContent = job.prompt;
  const when = document.createElement("time");
  when.className = "muted small";
  when.textContent = new Date(job.created_at).toLocaleString();
  li.append(badge, prompt, when);
  li.addEventListener("click", () => follow(job.id));
  return li;
}

async function refreshList() {
  if (!apiKey()) return;
  try {
    const page = await api("/v1/jobs?limit=10");
    $("jobs").replaceChildren(...page.data.map(listItem));
    $("jobs-empty").hidden = page.data.length > 0;
  } catch (err) {
    $("jobs-empty").hidden = false;
    $("jobs-empty").textContent = explain(err);
  }
  refreshAccount();
}

async function refreshAccount() {
  try {
    const acct = await api("/v1/account");
    const free = acct.credits.balance - acct.credits.reserved;
    $("credits").textContent = `${free} credits free · ${acct.active_jobs} running`;
  } catch {
    $("credits").textContent = "";
  }
}

// ---- forms --------------------------------------------------------------------------------------------

async function createJob(event) {
  event.preventDefault();
  $("form-error").textContent = "";
  const body = JSON.stringify({
    model: $("model").value.trim(),
    prompt: $("prompt").value,
    duration_s: Number($("duration").value),
    aspect_ratio: $("aspect-ratio").value,
    resolution: $("resolution").value,
  });
  if (!pendingCreate || pendingCreate.body !== body) pendingCreate = { body, key: randomKey() };
  $("render").disabled = true;
  try {
    const job = await api("/v1/jobs", {
      method: "POST",
      headers: { "Content-Type": "application/json", "Idempotency-Key": pendingCreate.key },
      body,
    });
    pendingCreate = null;
    renderJob(job);
    refreshList();
    follow(job.id);
  } catch (err) {
    // A network failure keeps the key: pressing Render again cannot make a second job.
    if (err instanceof ApiError) pendingCreate = null;
    $("form-error").textContent = explain(err);
  } finally {
    $("render").disabled = false;
  }
}

async function cancelJob() {
  const jobId = localStorage.getItem(JOB_STORE);
  if (!jobId) return;
  try {
    renderJob(await api(`/v1/jobs/${encodeURIComponent(jobId)}/cancel`, { method: "POST" }));
  } catch (err) {
    $("job-error").textContent = explain(err);
  }
}

function saveKey(event) {
  event.preventDefault();
  localStorage.setItem(KEY_STORE, $("api-key").value.trim());
  start();
}

function start() {
  $("api-key").value = apiKey();
  if (!apiKey()) return;
  refreshList();
  const jobId = localStorage.getItem(JOB_STORE);
  if (jobId) {
    $("job").hidden = false;
    follow(jobId);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("key-form").addEventListener("submit", saveKey);
  $("job-form").addEventListener("submit", createJob);
  $("cancel").addEventListener("click", cancelJob);
  $("refresh").addEventListener("click", refreshList);
  start();
});
