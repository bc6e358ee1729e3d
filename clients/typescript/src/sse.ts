// The text/event-stream format over a fetch body: an event is complete at its blank line.

export interface ServerEvent {
  event: string;
  data: string;
  id: string | null;
}

/**
 * The events of a stream, in order. `onBytes` is told whenever bytes arrive (a keepalive comment too), `onRetry`
 * of a `retry:` field (the server's word on when to reconnect, in milliseconds).
 */
export async function* serverEvents(body: ReadableStream<Uint8Array>, onBytes?: () => void,
  onRetry?: (ms: number) => void): AsyncGenerator<ServerEvent> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "";
  let data: string[] = [];
  let id: string | null = null;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      onBytes?.();
      buffer += decoder.decode(value, { stream: true });
      const lines = buffer.split(/\r\n|\r|\n/);
      buffer = lines.pop()!;
      for (const line of lines) {
        if (!line) {
          if (data.length) yield { event: event || "message", data: data.join("\n"), id };
          event = "";
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue; // a comment: the keepalive
        const colon = line.indexOf(":");
        const name = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (name === "event") event = value;
        else if (name === "data") data.push(value);
        else if (name === "id") id = value;
        else if (name === "retry" && /^\d+$/.test(value)) onRetry?.(Number(value));
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}
