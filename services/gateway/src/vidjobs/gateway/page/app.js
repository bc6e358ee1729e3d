// The vidjobs page: submit a render and follow it live. The server owns the job; this page only shows it,
// so closing the tab loses nothing: on return it reads the job's current state and follows it again.
//
// It calls the API with one of two credentials:
// - a link's browser token: a product sends a person to /#token=vjt_…&job=job_… (see takeLink). The page
//   then never asks for, reads or stores an API key, and offers only what the token may do;
// - an API key, typed into the page and kept in localStorage, for an operator or a developer.
// Progress comes over GET /v1/jobs/{id}/stream (Server-Sent Events), opened with a browser token in its URL
// (see "following a job" below); an API key never goes in a URL.
"use strict";

const STAGES = ["queued", "submitted", "rendering", "downloading", "ready"];
const TERMINAL = new Set(["completed", "failed", "canceled", "expired"]);
const ENDED_BADLY = new Set(["failed", "canceled", "expired"]);
const KEY_STORE = "vidjobs.key";
const JOB_STORE = "vidjobs.job";
const LINK_STORE = "vidjobs.link";
const PAGE_SIZE = 10;
const STREAM_TOKEN_TTL_S = 900; // the read-only token minted to stream one job with an API key
const LINK_REFUSED = "This link has expired or is no longer valid. Ask the app for a new link.";

// What a person can do about each error code (libs/common/errors.py); the message says what happened.
const ADVICE = {
  rate_limited: "The provider was busy. Try again in a few minutes.",
  provider_unavailable: "The provider was down. Try again later.",
  timeout: "The render ran past its deadline. Try again, perhaps with a shorter clip.",
  render_timeout: "The provider took longer than this model's renders do here, so it was stopped. Render again to try once more.",
  content_rejected: "Change the prompt (or the image) and render again; the same request will be refused again.",
  invalid_input: "Fix the field the message names, then render again.",
  quota_exhausted: "Credit ran out; the message says whose. If it was this account's, add credit, then render again; if ours with the provider, render again later.",
  provider_misconfigured: "The provider refused our setup, and we have been alerted. Render again later.",
  download_failed: "The render could not be saved. Try again.",
  verification_failed: "The provider returned a broken file. Render again, or choose another model.",
  canceled: "It was canceled. Render again if you still want it.",
  internal: "Something broke on our side. Try again; if it keeps failing, contact support.",
};

const $ = (id) => document.getElementById(id);
let following = null; // the stream being read: {jobId, source (an EventSource), timer, delay, stopped}
let pendingCreate = null; // {body, key}: a retried press of Render reuses its Idempotency-Key
let pendingRerun = null; // {jobId, key}: likewise for a retried press of Render again
let models = new Map(); // id -> the model as GET /v1/models describes it
let image = null; // {file, upload: Promise of the upload}: the chosen image, uploaded as soon as it is chosen
let announced = ""; // the stage last read out, so progress updates do not repeat it
let listGeneration = 0; // a reload of the list outdates any page still on its way
let nextCursor = null;
let listLinked = false; // the list shows the link's jobs one by one: its token may not list the account's

// ---- credentials ------------------------------------------------------------------------------------------

// A link: /#token=vjt_…&job=job_… (`job` may come more than once; the first is opened). A fragment never
// reaches a server, a log or a Referer, and the page takes it out of the address bar at once, so it is not left
// in the history, a bookmark, or an address copied from the page. The token is kept in sessionStorage and not
// in localStorage: it lasts as long as this tab (a reload keeps it, now that the address no longer holds it)
// and no longer, no other tab reads it, and nothing of it is left for whoever uses this browser next, where
// localStorage would keep it after the tab is closed, for every later visit. It is a credential as much as a
// key is, only a short-lived and narrow one.
function takeLink() {
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.has("token")) {
    history.replaceState(history.state, "", location.pathname + location.search);
    const token = params.get("token");
    const jobs = params.getAll("job").flatMap((j) => j.split(",")).filter((j) => /^job_[\w-]+$/.test(j));
    // Anything but a browser token (an API key pasted into a link, say) is not kept, not even here.
    sessionStorage.setItem(LINK_STORE, JSON.stringify({ token: token.startsWith("vjt_") ? token : "", jobs }));
    sessionStorage.removeItem(JOB_STORE); // a new link opens its own job
  }
  try {
    return JSON.parse(sessionStorage.getItem(LINK_STORE));
  } catch {
    return null;
  }
}

const link = takeLink(); // {token, jobs} in link mode, else null
// What the link's token may do, as found out at start (checkAbilities); an API key may do everything here.
const may = { create: !link, upload: !link };
// In link mode the current job is kept for this tab only, like the token; localStorage is not touched.
const jobStore = link ? sessionStorage : localStorage;

function apiKey() {
  return localStorage.getItem(KEY_STORE) || "";
}

function credential() {
  return link ? link.token : apiKey();
}

function rememberLinkedJob(jobId) {
  if (!link || link.jobs.includes(jobId)) return;
  link.jobs.push(jobId);
  sessionStorage.setItem(LINK_STORE, JSON.stringify(link));
}

// The token was refused (401: expired, or its issuer's key revoked, or the account closed): nothing on the page
// works any more, and the only remedy is a new link from the app.
function linkRefused() {
  stopFollowing();
  $("link-refused").hidden = false;
  for (const id of ["link-note", "link-no-create", "create-section", "job", "list-section"]) $(id).hidden = true;
}

class ApiError extends Error {
  constructor(status, body) {
    super(body?.error?.message || `HTTP ${status}`);
    this.status = status;
    this.code = body?.error?.code;
  }
}

async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${credential()}`, ...(options.headers || {}) };
  const resp = await fetch(path, { ...options, headers });
  if (resp.status === 204) return null;
  const body = await resp.json().catch(() => null);
  if (resp.status === 401 && link) linkRefused();
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
  if (err instanceof ApiError && err.status === 401) {
    return link ? LINK_REFUSED : "The API key was not accepted. Check it above.";
  }
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

function offerImage(inputImage) {
  $("image").disabled = inputImage === "none" || !may.upload;
  $("image").required = inputImage === "required" && !image && may.upload;
  if ((inputImage === "none" || !may.upload) && image) clearImage();
  const need = { none: "(not taken by this model)", optional: "(optional)", required: "(required)" };
  $("image-need").textContent = may.upload ? need[inputImage] || "" : "(this link cannot upload images)";
}

function offerInputs(model) {
  $("seed").disabled = !model.seed;
  $("negative-prompt").disabled = !model.negative_prompt;
  offerImage(model.input_image);
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

// "starts in about 2–4 min" (what: "starts" or "ready"), in the largest unit that reads well.
function within(what, early, late) {
  const now = Date.now();
  const low = (new Date(early) - now) / 1000;
  const high = (new Date(late) - now) / 1000;
  if (high <= 0) return `${what} any moment now`;
  const [size, unit] = high < 90 ? [1, " s"] : high < 90 * 60 ? [60, " min"] : [3600, " h"];
  return `${what} in about ${range(Math.max(0, Math.floor(low / size)), Math.ceil(high / size), unit)}`;
}

function startsIn(early, late) {
  return within("starts", early, late);
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

// A rendering job's range (GET /v1/jobs/{id} `ready`): when it is likely to be ready, or why no one can say.
function readyLine(ready) {
  if (!ready.ready_p50 || !ready.ready_p90) return `no estimate yet: ${ready.note}`;
  return within("ready", ready.ready_p50, ready.ready_p90);
}

// A retried job keeps its stage; this says it is another go, and why (GET /v1/jobs/{id} `retry`: what ended the
// last try, which while `retrying` is the attempt it shows).
function attemptLine(job) {
  if (!job.retry) return job.attempt > 1 ? `attempt ${job.attempt}` : "";
  const of = job.retry.max_attempts ? ` of ${job.retry.max_attempts}` : "";
  if (job.status === "retrying") return `attempt ${job.attempt}${of} ended: ${job.retry.message}`;
  return `attempt ${job.attempt}${of}; the last try ended: ${job.retry.message}`;
}

function statusLine(job) {
  const parts = [`${job.stage}`];
  const attempt = attemptLine(job);
  if (attempt) parts.push(attempt);
  if (job.status === "pending" && job.queue_position) parts.push(`number ${job.queue_position} in your queue`);
  if (job.status === "pending" && job.priority === "batch") parts.push("batch: after your interactive jobs");
  if (job.status === "pending" && job.estimate) parts.push(estimateLine(job.estimate));
  if (job.status === "pending" && job.queue_reason) parts.push(job.queue_reason);
  if (job.ready) parts.push(readyLine(job.ready));
  if (job.progress !== null && job.progress !== undefined) parts.push(`${Math.round(job.progress * 100)}% (as reported by the provider)`);
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
  // A browser token may not cancel or render again (nor delete): those stay with the app.
  $("cancel").hidden = !!link || TERMINAL.has(job.status);
  $("rerun").hidden = !!link || !TERMINAL.has(job.status);
  $("job-rerun-of").hidden = !job.rerun_of;
  $("job-rerun-of").textContent = job.rerun_of ? `Renders ${job.rerun_of} again.` : "";
  renderResult(job);
  markInList(job);
}

function showGone(jobId) {
  $("job-title").textContent = jobId;
  $("job-status").textContent = "";
  $("job-cost").textContent = "";
  showProblem(link ? "This job no longer exists, or this link does not show it."
    : "This job no longer exists (deleted, or it belongs to another key).");
  $("cancel").hidden = true;
  $("rerun").hidden = true;
  $("result").hidden = true;
  jobStore.removeItem(JOB_STORE);
}

function forget(jobId) {
  if (jobStore.getItem(JOB_STORE) !== jobId) return;
  stopFollowing();
  jobStore.removeItem(JOB_STORE);
  $("job").hidden = true;
}

// ---- following a job over Server-Sent Events --------------------------------------------------------
//
// The stream is read with EventSource, which cannot send an Authorization header: it is opened with a browser
// token in `access_token`, the one credential the gateway takes in a URL (on a GET, and it logs the path
// only). In link mode that is the link's token; with an API key, the page mints a token for this one job,
// read-only, for 15 minutes, so the key itself never goes in a URL (where a proxy's log or the history could
// keep it), and what could leak is worth one job's progress for minutes.
// This page used to read the stream with fetch() and the key in a header, parsing the events and reconnecting
// itself. EventSource is the simpler of the two now that a token is at hand in either mode: the browser parses
// the events and reconnects by itself after a dropped connection, after the delay the server asks for
// (`retry:`). What it does not tell is why a connection was refused (it gives up and says nothing more), so
// then the page asks GET /v1/jobs/{id} with the header: 401, 404 or the job, which says whether to reconnect.

const streamTokens = new Map(); // job id -> {token, until}: tokens minted to stream one job with an API key

async function streamToken(jobId) {
  if (link) return link.token;
  const kept = streamTokens.get(jobId);
  if (kept && kept.until - Date.now() > 60_000) return kept.token;
  const minted = await api("/v1/account/tokens", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ scopes: ["read"], jobs: [jobId], ttl_s: STREAM_TOKEN_TTL_S }),
  });
  // Timed by this browser's clock, not the server's expires_at: a clock that is off cannot keep a dead token.
  streamTokens.set(jobId, { token: minted.token, until: Date.now() + STREAM_TOKEN_TTL_S * 1000 });
  return minted.token;
}

function stopFollowing() {
  if (!following) return;
  following.stopped = true;
  following.source?.close();
  clearTimeout(following.timer);
  following = null;
}

function follow(jobId) {
  stopFollowing();
  following = { jobId, source: null, timer: null, delay: 1000, stopped: false };
  jobStore.setItem(JOB_STORE, jobId);
  openStream(following);
}

async function openStream(run) {
  let token;
  try {
    token = await streamToken(run.jobId);
  } catch (err) {
    if (run.stopped) return;
    if (err instanceof ApiError) return showProblem(explain(err));
    return retryLater(run); // the network, not the key
  }
  if (run.stopped) return;
  const source = new EventSource(`${jobPath(run.jobId)}/stream?access_token=${encodeURIComponent(token)}`);
  run.source = source;
  source.addEventListener("job", (event) => {
    if (run.stopped) return;
    const job = JSON.parse(event.data);
    run.delay = 1000;
    renderJob(job);
    if (TERMINAL.has(job.status)) {
      source.close(); // the server ends the stream now; EventSource would open it again
      refreshAccount();
    }
  });
  source.addEventListener("error", () => {
    if (run.stopped) return;
    if (source.readyState === EventSource.CONNECTING) {
      $("job-status").textContent = "connection lost; reconnecting…"; // the browser is on it
      return;
    }
    source.close(); // refused, or not a stream: the browser gave up
    recheck(run);
  });
}

async function recheck(run) {
  try {
    const job = await api(jobPath(run.jobId));
    if (run.stopped) return;
    renderJob(job);
    if (TERMINAL.has(job.status)) return;
  } catch (err) {
    if (run.stopped) return;
    if (err instanceof ApiError && err.status === 404) return showGone(run.jobId);
    if (err instanceof ApiError && (err.status === 401 || err.status === 403)) return showProblem(explain(err));
  }
  streamTokens.delete(run.jobId); // in case it was the token that died: the next connection mints another
  retryLater(run);
}

function retryLater(run) {
  $("job-status").textContent = `connection lost; reconnecting in ${run.delay / 1000} s`;
  run.timer = setTimeout(() => openStream(run), run.delay);
  run.delay = Math.min(run.delay * 2, 15000);
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
    const download = element("a", "download", "Download");
    download.href = job.outputs.video_url;
    download.download = `${job.id}.mp4`;
    box.append(download);
  }
  if (link) return box; // a browser token may not delete
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

// A token limited to some jobs may not list the account's (403): the list is then those jobs, read one by
// one, newest first, filtered here.
async function linkedJobs() {
  const found = await Promise.all(link.jobs.map((id) => api(jobPath(id)).catch(() => null)));
  const shown = $("status-filter").value.split(",");
  const data = found.filter((job) => job && (!shown[0] || shown.includes(job.status)))
    .sort((a, b) => b.created_at.localeCompare(a.created_at));
  return { data, next_cursor: null };
}

async function jobsPage(params) {
  if (!listLinked) {
    try {
      return await api(`/v1/jobs?${params}`);
    } catch (err) {
      if (!(link && err instanceof ApiError && err.status === 403)) throw err;
      listLinked = true;
    }
  }
  return linkedJobs();
}

async function loadJobs(more) {
  if (!credential()) return [];
  const generation = more ? listGeneration : ++listGeneration;
  const params = listQuery();
  if (more) params.set("cursor", nextCursor);
  try {
    const page = await jobsPage(params);
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
  if (link) return; // a browser token may not read the account
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
  if (!may.create) return showAbilities();
  $("render").disabled = true;
  try {
    const job = await submit(requestBody(await uploadedImageId()));
    rememberLinkedJob(job.id); // a token limited to some jobs sees the ones it creates too
    renderJob(job);
    refreshList();
    follow(job.id);
  } catch (err) {
    // A network failure keeps the key: pressing Render again cannot make a second job.
    if (err instanceof ApiError) pendingCreate = null;
    if (link && err instanceof ApiError && err.status === 403) {
      may.create = false;
      showAbilities();
    }
    $("form-error").textContent = explain(err);
  } finally {
    $("render").disabled = !may.create;
  }
}

async function cancelJob() {
  const jobId = jobStore.getItem(JOB_STORE);
  if (!jobId) return;
  try {
    renderJob(await api(`${jobPath(jobId)}/cancel`, { method: "POST" }));
  } catch (err) {
    showProblem(explain(err));
  }
}

// The job shown, rendered again as a new job (POST /v1/jobs/{id}/rerun), which the page then follows.
async function rerunJob() {
  const jobId = jobStore.getItem(JOB_STORE);
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
  if (link) return; // a link's page never takes a key
  localStorage.setItem(KEY_STORE, $("api-key").value.trim());
  start();
}

// What the link's token may do, from its own grant (GET /v1/token; a 401 there is a dead link).
async function checkAbilities() {
  let grant;
  try {
    grant = await api("/v1/token");
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) return linkRefused();
    grant = { scopes: [] }; // unknown: offer nothing the token may lack
  }
  may.create = grant.scopes.includes("create");
  may.upload = grant.scopes.includes("upload");
  applyModel();
  showAbilities();
}

function showAbilities() {
  if (!$("link-refused").hidden) return;
  $("create-section").hidden = !may.create;
  $("render").disabled = !may.create;
  $("link-no-create").hidden = may.create;
  if (!may.upload) offerImage(models.get($("model").value)?.input_image); // even were the models not read
}

function startWithLink() {
  $("key-section").hidden = true;
  $("link-section").hidden = false;
  $("create-section").hidden = true; // until the token is known to create
  if (!link.token) return linkRefused();
  const jobId = jobStore.getItem(JOB_STORE) || link.jobs[0];
  if (jobId) {
    $("job").hidden = false;
    follow(jobId);
  }
  loadModels();
  refreshList();
  checkAbilities();
}

function start() {
  if (link) return startWithLink();
  $("api-key").value = apiKey();
  if (!apiKey()) return;
  loadModels();
  refreshList();
  const jobId = jobStore.getItem(JOB_STORE);
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
  // A new link opened in this tab while the page is showing changes only the fragment: take it and start over.
  window.addEventListener("hashchange", () => {
    if (new URLSearchParams(location.hash.slice(1)).has("token") && takeLink()) location.reload();
  });
  start();
});
