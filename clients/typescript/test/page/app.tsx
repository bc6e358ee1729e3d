// A product's page built with the hooks: a person renders a clip and watches it go from queued to ready, with
// its place in the queue and its estimate while it waits. The browser token comes in the address's fragment.
import { useEffect, useState } from "react";
import { createRoot } from "react-dom/client";
import { Vidjobs } from "@vidjobs/client";
import { useCreateJob, useJob } from "@vidjobs/client/react";

const token = new URLSearchParams(location.hash.slice(1)).get("token") ?? "";
declare global {
  interface Window {
    seen: string[];
    progress: number[][];
  }
}
window.seen = [];
window.progress = [];

/** A first frame of noise, made on a canvas, uploaded with its progress shown. */
async function uploadFrame(): Promise<string> {
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = 300;
  const context = canvas.getContext("2d")!;
  const pixels = context.createImageData(300, 300);
  for (let i = 0; i < pixels.data.length; i++) pixels.data[i] = i % 4 === 3 ? 255 : Math.random() * 256;
  context.putImageData(pixels, 0, 0);
  const image = await new Promise<Blob>((resolve) => canvas.toBlob((b) => resolve(b!), "image/png"));
  const vj = new Vidjobs({ baseUrl: location.origin, auth: token });
  const upload = await vj.uploads.create(image, { onProgress: (sent, total) => window.progress.push([sent, total]) });
  return `${upload.id} ${upload.status} ${upload.width}x${upload.height}`;
}

function JobView({ jobId }: { jobId: string }) {
  const live = useJob(jobId, { token });
  useEffect(() => {
    if (live.stage && window.seen.at(-1) !== live.stage) window.seen.push(live.stage);
  }, [live.stage]);
  return (
    <section id="job" data-stage={live.stage ?? ""} data-done={String(live.done)}>
      <p id="stage">{live.stage ?? "connecting"}</p>
      {live.place !== null && <p id="place">Place in the queue: {live.place}</p>}
      {live.estimate && <p id="estimate">{live.estimate.note}</p>}
      {live.ready && <p id="ready">{live.ready.note}</p>}
      {live.reconnecting && <p id="reconnecting">Reconnecting…</p>}
      {live.outputs && <video id="video" src={live.outputs.video_url ?? undefined} controls />}
      {live.error && <p id="error">{live.error.message}</p>}
      {live.problem && <p id="problem">{live.problem.message}</p>}
    </section>
  );
}

function App() {
  const { create, job, pending, error } = useCreateJob({ token });
  const [scenario, setScenario] = useState("succeed");
  const [shown, setShown] = useState(true);
  const [uploaded, setUploaded] = useState("");
  const render = () => {
    setShown(true);
    create({ model: "fake/default", prompt: "a red fox in snow", duration_s: 1, params: { render_s: 1, scenario } })
      .catch(() => {}); // shown from `error`
  };
  return (
    <main>
      <select id="scenario" value={scenario} onChange={(e) => setScenario(e.target.value)}>
        <option value="succeed">succeed</option>
        <option value="hang">hang</option>
      </select>
      <button id="render" disabled={pending} onClick={render}>Render</button>
      <button id="hide" onClick={() => setShown(false)}>Hide</button>
      <button id="upload" onClick={() => uploadFrame().then(setUploaded, (e) => setUploaded(String(e)))}>Upload a frame</button>
      {uploaded && <p id="uploaded">{uploaded}</p>}
      {error && <p id="create-error">{error.message}</p>}
      {job && shown && <JobView key={job.id} jobId={job.id} />}
    </main>
  );
}

createRoot(document.getElementById("root")!).render(<App />);
