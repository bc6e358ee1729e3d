// The vidjobs page: submit a render and follow it live. The server owns the job; this page only shows it,
// so closing the tab loses nothing: on return it reads the job's current state and follows it again.
//
// Progress comes over GET /v1/jobs/{id}/stream (Server-Sent Events). EventSource cannot send an
// Authorization header, and putting the key in the URL would leak it into logs and history, so the stream
// is read with fetch() and parsed here.
"use strict";

const STAGES = ["queued", "submitted", "rendering", "downloading", "ready"];
const TERMINAL = new Set(["completed", "failed", "canceled", "expired"]);
const ENDED_BADLY = new Set(["failed", "canceled", "expired"]);
const KEY_STORE = "vidjobs.key";
const JOB_STORE = "vidjobs.job";
const PAGE_SIZE = 10;

// What a person can do about each error code (libs/common/errors.py); the message says what happened.
const ADVICE = {
  rate_limited: "The provider was busy. Try again in a few minutes.",
  provider_unavailable: "The provider was down. Try again later.",
  timeout: "The render ran past its deadline. Try again, perhaps with a shorter clip.",
  render_timeout: "The provider took longer than this model's renders do here, so it was stopped. Render again to try once more.",
  content_rejected: "Change the prompt (or the image) and render again; the same request will be refused again.",
  invalid_input: "Fix the field the message names, then render again.",
  quota_exhausted: "Add credit to the account, then render again.",
  download_failed: "The render could not be saved. Try again.",
  verification_failed: "The provider returned a broken file. Render again, or choose another model.",
  canceled: "It was canceled. Render again if you still want it.",
  internal: "Something broke on our side. Try again; if it keeps failing, contact support.",
};

const $ = (id) => document.getElementById(id);
let following = null; // AbortController of the stream being read
let pendingCreate = null; // {body, key}: a retried press of Render reuses its Idempotency-Key
let pendingRerun = null; // {jobId, key}: likewise for a retried press of Render again
let models = new Map(); // id -> the model as GET /v1/models describes it
let image = null; // {file, upload: Promise of the upload}: the chosen image, uploaded as soon as it is chosen
let announced = ""; // the stage last read out, so progress updates do not repeat it
let listGeneration = 0; // a reload of the list outdates any page still on its way
let nextCursor = null;

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

function jobPath(jobId) {
  return `/v1/jobs/${encodeURIComponent(jobId)}`;
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

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// ---- models: what the form offers follows what the chosen model renders ---------------------------------

function unique(values) {
  return [...new Set(values)];
}

function fillSelect(select, values, preferred) {
  // The person's choice survives a refill whenever the new model still offers it.
  const keep = values.includes(select.value) ? select.value : values.includes(preferred) ? preferred : values[0];
  select.replaceChildren(...values.map((v) => new Option(v, v)));
  if (keep !== undefined) select.value = keep;
}

function formatsOf(model) {
  return image && model.formats_with_image ? model.formats_with_image : model.formats;
}

function offerFormats(model) {
  const formats = formatsOf(model);
  fillSelect($("aspect-ratio"), unique(formats.map((f) => f.aspect_ratio)), "16:9");
  const forRatio = formats.filter((f) => f.aspect_ratio === $("aspect-ratio").value);
  fillSelect($("resolution"), unique(forRatio.map((f) => f.resolution)), "720p");
  const format = forRatio.find((f) => f.resolution === $("resolution").value);
  fillSelect($("duration"), (format?.durations_s || model.durations_s).map(String), "5");
}

function offerInputs(model) {
  $("seed").disabled = !model.seed;
  $("negative-prompt").disabled = !model.negative_prompt;
  $("image").disabled = model.input_image === "none";
  $("image").required = model.input_image === "required" && !image;
  if (model.input_image === "none" && image) clearImage();
  const need = { none: "(not taken by this model)", optional: "(optional)", required: "(required)" };
  $("image-need").textContent = need[model.input_image] || "";
}

function describeModel(model) {
  const parts = [];
  if (!model.seed) parts.push("takes no seed");
  if (!model.negative_prompt) parts.push("takes no negative prompt");
  const price = model.credits_per_second[$("resolution").value];
  if (price !== null && price !== undefined) parts.push(`${price} credits per second at ${$("resolution").value}`);
  return parts.length ? `${model.id}: ${parts.join(" · ")}` : "";
}

function applyModel() {
  const model = models.get($("model").value);
  if (!model) return;
  offerFormats(model);
  offerInputs(model);
  $("model-info").textContent = describeModel(model);
}

async function loadModels() {
  try {
    const list = await api("/v1/models");
    models = new Map(list.data.map((m) => [m.id, m]));
  } catch {
    return; // the static choices stay; a create names any refusal precisely
  }
  fillSelect($("model"), [...models.keys()], "fake/default");
  applyModel();
}

// ---- the input image ------------------------------------------------------------------------------------

function showPreview(file) {
  // A data: URL, because the page's CSP allows data: images and not blob: ones.
  const reader = new FileReader();
  reader.onload = () => {
    if (image?.file !== file) return;
    $("image-preview").src = reader.result;
    $("image-preview").hidden = false;
  };
  reader.readAsDataURL(file);
}

function setImageStatus(text, isError = false) {
  $("image-status").textContent = text;
  $("image-status").classList.toggle("error", isError);
}

const UPLOAD_POLL_MS = 300; // how often a processing upload is asked about; decoding takes about a second

// The upload once the media worker has decoded it: ready, or an Error saying why it was rejected.
async function readyUpload(file) {
  let up = await api("/v1/uploads", {
    method: "POST", headers: { "Content-Type": file.type || "application/octet-stream" }, body: file,
  });
  while (up.status === "processing") {
    if (image?.file !== file) return up; // another image was chosen: nobody waits for this one
    setImageStatus("checking the image…");
    await new Promise((resolve) => setTimeout(resolve, UPLOAD_POLL_MS));
    up = await api(`/v1/uploads/${encodeURIComponent(up.id)}`);
  }
  if (up.status === "rejected") throw new Error(`${up.error.message} (${up.error.code})`);
  return up;
}

function chooseImage() {
  const file = $("image").files[0];
  if (!file) return clearImage();
  image = { file, upload: null };
  const upload = readyUpload(file);
  image.upload = upload;
  $("image-preview").hidden = true;
  $("image-clear").hidden = false;
  showPreview(file);
  setImageStatus("uploading…");
  upload.then(
    (up) => image?.upload === upload && setImageStatus(`uploaded (${up.width}×${up.height})`),
    (err) => image?.upload === upload && setImageStatus(`not accepted: ${explain(err)}`, true),
  );
  applyModel();
}

function clearImage() {
  image = null;
  $("image").value = "";
  $("image-preview").hidden = true;
  $("image-preview").removeAttribute("src");
  $("image-clear").hidden = true;
  setImageStatus("");
  applyModel();
}

// ---- the current job ----------------------------------------------------------------------------------

function renderStages(job) {
  const reached = STAGES.indexOf(job.stage);
  for (const li of $("stages").children) {
    const i = STAGES.indexOf(li.dataset.stage);
    li.classList.toggle("done", reached >= 0 && i < reached);
    li.classList.toggle("current", i === reached);
    li.classList.toggle("stopped", reached < 0);
    if (i === reached) li.setAttribute("aria-current", "step");
    else li.removeAttribute("aria-current");
  }
  const said = `${job.id} ${job.stage}`;
  if (said !== announced) {
    announced = said;
    $("stage-announce").textContent = `Stage: ${job.stage}`;
  }
}

// "a–b" when the two differ.
function range(low, high, unit = "") {
  return low === high ? `${low}${unit}` : `${low}–${high}${unit}`;
}

function startsIn(early, late) {
  const now = Date.now();
  const low = (new Date(early) - now) / 1000;
  const high = (new Date(late) - now) / 1000;
  if (high <= 0) return "starts any moment now";
  const [size, unit] = high < 90 ? [1, " s"] : high < 90 * 60 ? [60, " min"] : [3600, " h"];
  return `starts in about ${range(Math.max(0, Math.floor(low / size)), Math.ceil(high / size), unit)}`;
}

function readyBy(early, late) {
  // To the second when it is minutes away, else to the minute.
  const precise = new Date(late) - Date.now() < 600_000;
  const shape = precise ? { hour: "2-digit", minute: "2-digit", second: "2-digit" } : { hour: "2-digit", minute: "2-digit" };
  const low = new Date(early).toLocaleTimeString([], shape);
  const high = new Date(late).toLocaleTimeString([], shape);
  return `ready by ${low === high ? low : `${low}–${high}`}`;
}

// A waiting job's estimate (GET /v1/jobs/{id} `estimate`): jobs ahead, and when it starts and is ready as a
// range from the typical case to a late one, or why there is none yet.
function estimateLine(estimate) {
  const most = Math.max(estimate.jobs_ahead, estimate.jobs_ahead_p90 ?? estimate.jobs_ahead);
  const ahead = `${range(estimate.jobs_ahead, most)} job${most === 1 ? "" : "s"} ahead`;
  if (!estimate.start_p50 || !estimate.start_p90 || !estimate.ready_p50 || !estimate.ready_p90) {
    return `${ahead}; no estimate yet: ${estimate.note}`;
  }
  return `${ahead}; ${startsIn(estimate.start_p50, estimate.start_p90)}, ${readyBy(estimate.ready_p50, estimate.ready_p90)}`;
}

function statusLine(job) {
  const parts = [`${job.stage}`];
  if (job.status === "pending" && job.queue_position) parts.push(`number ${job.queue_position} in your queue`);
  if (job.status === "pending" && job.priority === "batch") parts.push("batch: after your interactive jobs");
  if (job.status === "pending" && job.estimate) parts.push(estimateLine(job.estimate));
  if (job.status === "pending" && job.queue_reason) parts.push(job.queue_reason);
  if (job.progress !== null && job.progress !== undefined) parts.push(`${Math.round(job.progress * 100)}% (as reported by the provider)`);
  if (job.attempt > 1) parts.push(`attempt ${job.attempt}`);
  if (job.status === "retrying" && job.error) parts.push(`retrying after: ${job.error.message}`);
  parts.push(`updated ${new Date(job.updated_at).toLocaleTimeString()}`);
  return parts.join(" · ");
}

function costLine(cost) {
  if (!cost) return "";
  if (cost.actual_credits !== null && cost.actual_credits !== undefined) {
    return `Cost: ${cost.actual_credits} credits charged (${cost.estimated_credits} were reserved).`;
  }
  return `Cost: up to ${cost.estimated_credits} credits reserved; the charge is settled when it ends.`;
}

function advice(job) {
  if (job.error && ADVICE[job.error.code]) return ADVICE[job.error.code];
  if (job.status === "expired") return "Its files were removed after the retention period. Render it again to get it back.";
  if (job.status === "canceled") return ADVICE.canceled;
  return job.error?.retryable ? "Try again." : "Change the request before trying again.";
}

function showProblem(message, code = "", what = "") {
  $("job-failure").hidden = !message;
  $("job-error").textContent = message;
  $("job-error-code").textContent = code;
  $("job-advice").textContent = what;
}

function renderFailure(job) {
  if (!ENDED_BADLY.has(job.status)) return showProblem("");
  showProblem(job.error ? job.error.message : job.status, job.error?.code || "", advice(job));
}

// Retention counts from completion: the answer's retained_until says when, null while the clip is kept.
function keptLine(job) {
  const out = job.outputs;
  if (job.status !== "completed") return "";
  if (out.kept) return "Kept until released.";
  return out.retained_until ? `Removed after ${new Date(out.retained_until).toLocaleString()} unless kept.` : "";
}

function renderResult(job) {
  const out = job.outputs;
  $("result").hidden = !out;
  if (!out) {
    $("video").removeAttribute("src");
    return;
  }
  // An expired job keeps its thumbnail; its video is gone.
  $("video").hidden = !out.video_url;
  $("download").hidden = !out.video_url;
  if (out.video_url && $("video").getAttribute("src") !== out.video_url) {
    $("video").src = out.video_url;
    $("video").poster = out.thumbnail_url;
    $("download").href = out.video_url;
    $("download").download = `${job.id}.mp4`;
  }
  if ($("thumbnail").getAttribute("src") !== out.thumbnail_url) $("thumbnail").src = out.thumbnail_url;
  const mb = (out.bytes / 1e6).toFixed(2);
  $("result-meta").textContent = `${out.width}×${out.height}, ${out.duration_s.toFixed(1)} s, ${mb} MB. ` +
    `Links valid until ${new Date(out.expires_at).toLocaleString()}. ` + keptLine(job);
}

function renderJob(job) {
  $("job").hidden = false;
  $("job-title").textContent = job.id;
  $("job-prompt").textContent = job.prompt;
  renderStages(job);
  $("job-status").textContent = statusLine(job);
  $("job-cost").textContent = costLine(job.cost);
  renderFailure(job);
  $("cancel").hidden = TERMINAL.has(job.status);
  $("rerun").hidden = !TERMINAL.has(job.status);
  $("job-rerun-of").hidden = !job.rerun_of;
  $("job-rerun-of").textContent = job.rerun_of ? `Renders ${job.rerun_of} again.` : "";
  renderResult(job);
  markInList(job);
}

function showGone(jobId) {
  $("job-title").textContent = jobId;
  $("job-status").textContent = "";
  $("job-cost").textContent = "";
  showProblem("This job no longer exists (deleted, or it belongs to another key).");
  $("cancel").hidden = true;
  $("rerun").hidden = true;
  $("result").hidden = true;
  localStorage.removeItem(JOB_STORE);
}

function forget(jobId) {
  if (localStorage.getItem(JOB_STORE) !== jobId) return;
  if (following) following.abort();
  following = null;
  localStorage.removeItem(JOB_STORE);
  $("job").hidden = true;
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
  const resp = await fetch(`${jobPath(jobId)}/stream`, {
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
      if (!signal.aborted) renderJob(last);
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
      if (last && TERMINAL.has(last.status)) return refreshAccount();
      // The stream ended early (server restart, or the job was deleted): look before reconnecting.
      renderJob(await api(jobPath(jobId)));
      delay = 1000;
    } catch (err) {
      if (controller.signal.aborted) return;
      if (err instanceof ApiError && err.status === 404) return showGone(jobId);
      if (err instanceof ApiError && err.status === 401) return showProblem(explain(err));
      $("job-status").textContent = `connection lost; reconnecting in ${delay / 1000} s`;
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 15000);
    }
  }
}

// ---- recent jobs and the account ---------------------------------------------------------------------

function listedItem(jobId) {
  return document.querySelector(`#jobs li[data-id="${CSS.escape(jobId)}"]`);
}

function markInList(job) {
  const li = listedItem(job.id);
  if (!li || (li.dataset.stage === job.stage && li.dataset.outputs === String(!!job.outputs))) return;
  // Replaced whole, so a job that just finished gains its thumbnail and links; focus stays on it.
  const hadFocus = li.contains(document.activeElement);
  const fresh = listItem(job);
  li.replaceWith(fresh);
  if (hadFocus) fresh.querySelector(".open").focus();
}

function previewOnHover(trigger, box, url) {
  let video = null;
  const play = () => {
    if (!video) {
      video = element("video", "preview");
      video.muted = true;
      video.defaultMuted = true;
      video.loop = true;
      video.playsInline = true;
      video.src = url;
      box.append(video);
    }
    box.classList.add("playing");
    // A play() cut short by leaving again rejects; that is not an error worth showing.
    video.play().catch(() => {});
  };
  const stop = () => {
    box.classList.remove("playing");
    if (video) video.pause();
  };
  trigger.addEventListener("mouseenter", play);
  trigger.addEventListener("focus", play);
  trigger.addEventListener("mouseleave", stop);
  trigger.addEventListener("blur", stop);
}

function thumbnailBox(job, trigger) {
  const box = element("span", "thumb");
  const out = job.outputs;
  if (!out) return box;
  const img = element("img");
  img.src = out.thumbnail_url;
  img.alt = "";
  img.loading = "lazy";
  box.append(img);
  if (out.preview_url) previewOnHover(trigger, box, out.preview_url);
  return box;
}

function openButton(job) {
  const button = element("button", "open");
  button.type = "button";
  const when = element("time", "muted small", new Date(job.created_at).toLocaleString());
  when.dateTime = job.created_at;
  const badge = element("span", "badge", job.stage);
  badge.dataset.stage = job.stage;
  const text = element("span", "text");
  text.append(element("span", "prompt", job.prompt), when);
  button.append(thumbnailBox(job, button), badge, text);
  button.setAttribute("aria-label", `${job.stage}: ${job.prompt}, ${when.textContent}`);
  return button;
}

function actions(job, li) {
  const box = element("span", "actions");
  if (job.outputs?.video_url) {
    const link = element("a", "download", "Download");
    link.href = job.outputs.video_url;
    link.download = `${job.id}.mp4`;
    box.append(link);
  }
  const remove = element("button", "delete secondary", "Delete");
  remove.type = "button";
  remove.setAttribute("aria-label", `Delete job ${job.id}`);
  remove.addEventListener("click", () => deleteJob(job, li));
  box.append(remove);
  return box;
}

function listItem(job) {
  const li = element("li");
  li.dataset.id = job.id;
  li.dataset.stage = job.stage;
  li.dataset.outputs = String(!!job.outputs);
  li.append(openButton(job), actions(job, li));
  li.addEventListener("click", (event) => {
    if (!event.target.closest(".actions")) follow(job.id);
  });
  return li;
}

function listQuery() {
  const params = new URLSearchParams({ limit: String(PAGE_SIZE) });
  if ($("status-filter").value) params.set("status", $("status-filter").value);
  return params;
}

async function loadJobs(more) {
  if (!apiKey()) return [];
  const generation = more ? listGeneration : ++listGeneration;
  const params = listQuery();
  if (more) params.set("cursor", nextCursor);
  try {
    const page = await api(`/v1/jobs?${params}`);
    if (generation !== listGeneration) return [];
    // A job created since the first page was read may shift one onto the next page as well.
    const items = page.data.filter((job) => !(more && listedItem(job.id))).map(listItem);
    if (more) $("jobs").append(...items);
    else $("jobs").replaceChildren(...items);
    nextCursor = page.next_cursor;
    $("more").hidden = !nextCursor;
    $("jobs-empty").hidden = $("jobs").children.length > 0;
    $("jobs-empty").textContent = $("status-filter").value ? "No jobs with this status." : "No jobs yet.";
    $("jobs-error").textContent = "";
    return items;
  } catch (err) {
    if (generation === listGeneration) $("jobs-error").textContent = explain(err);
    return [];
  }
}

async function refreshList() {
  await loadJobs(false);
  refreshAccount();
}

async function loadMore() {
  if (!nextCursor) return;
  $("more").disabled = true;
  const items = await loadJobs(true);
  $("more").disabled = false;
  // Keyboard users continue from the first job the button brought in, not from the top of the page.
  if (items.length) items[0].querySelector(".open").focus();
}

async function deleteJob(job, li) {
  if (!confirm(`Delete job ${job.id}? Its video and files are removed too.`)) return;
  try {
    await api(jobPath(job.id), { method: "DELETE" });
  } catch (err) {
    // Already gone is what was asked for.
    if (!(err instanceof ApiError && err.status === 404)) {
      $("jobs-error").textContent = explain(err);
      return;
    }
  }
  const next = li.nextElementSibling || li.previousElementSibling;
  li.remove();
  forget(job.id);
  $("jobs-empty").hidden = $("jobs").children.length > 0;
  (next?.querySelector(".open") || $("refresh")).focus();
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

function optionalText(id) {
  const value = $(id).value.trim();
  return $(id).disabled || value === "" ? null : value;
}

function requestBody(inputImage) {
  const seed = optionalText("seed");
  return JSON.stringify({
    model: $("model").value,
    prompt: $("prompt").value,
    duration_s: Number($("duration").value),
    aspect_ratio: $("aspect-ratio").value,
    resolution: $("resolution").value,
    seed: seed === null ? null : Number(seed),
    negative_prompt: optionalText("negative-prompt"),
    input_image: inputImage,
  });
}

async function uploadedImageId() {
  if (!image) return null;
  try {
    return (await image.upload).id;
  } catch (err) {
    throw new Error(`The image was not accepted: ${explain(err)}`);
  }
}

async function submit(body) {
  if (!pendingCreate || pendingCreate.body !== body) pendingCreate = { body, key: randomKey() };
  const job = await api("/v1/jobs", {
    method: "POST",
    headers: { "Content-Type": "application/json", "Idempotency-Key": pendingCreate.key },
    body,
  });
  pendingCreate = null;
  return job;
}

async function createJob(event) {
  event.preventDefault();
  $("form-error").textContent = "";
  $("render").disabled = true;
  try {
    const job = await submit(requestBody(await uploadedImageId()));
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
    renderJob(await api(`${jobPath(jobId)}/cancel`, { method: "POST" }));
  } catch (err) {
    showProblem(explain(err));
  }
}

// The job shown, rendered again as a new job (POST /v1/jobs/{id}/rerun), which the page then follows.
async function rerunJob() {
  const jobId = localStorage.getItem(JOB_STORE);
  if (!jobId) return;
  if (!pendingRerun || pendingRerun.jobId !== jobId) pendingRerun = { jobId, key: randomKey() };
  $("rerun").disabled = true;
  try {
    const job = await api(`${jobPath(jobId)}/rerun`, {
      method: "POST", headers: { "Idempotency-Key": pendingRerun.key },
    });
    pendingRerun = null;
    renderJob(job);
    refreshList();
    follow(job.id);
  } catch (err) {
    // A network failure keeps the key: pressing Render again once more cannot make a second job.
    if (err instanceof ApiError) pendingRerun = null;
    showProblem(explain(err));
  } finally {
    $("rerun").disabled = false;
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
  loadModels();
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
  for (const id of ["model", "aspect-ratio", "resolution"]) $(id).addEventListener("change", applyModel);
  $("image").addEventListener("change", chooseImage);
  $("image-clear").addEventListener("click", clearImage);
  $("cancel").addEventListener("click", cancelJob);
  $("rerun").addEventListener("click", rerunJob);
  $("refresh").addEventListener("click", refreshList);
  $("status-filter").addEventListener("change", refreshList);
  $("more").addEventListener("click", loadMore);
  start();
});
