// A minimal server-sent-events reader over fetch's ReadableStream.
// Frames are `event:` / `data:` lines ended by a blank line; lines starting
// with `:` (the server's `: keep-alive`) are comments and are skipped.

export interface SseEvent {
  event: string | null;
  data: string;
}

/** Feeds text chunks (split anywhere) and yields complete events. */
export class SseParser {
  private buf = '';
  private event: string | null = null;
  private data: string[] = [];

  push(chunk: string): SseEvent[] {
    this.buf += chunk;
    const out: SseEvent[] = [];
    for (;;) {
      const nl = this.buf.search(/\r\n|\n|\r/);
      if (nl < 0) break;
      // A lone '\r' at the very end may be the first half of '\r\n'.
      if (this.buf[nl] === '\r' && nl === this.buf.length - 1) break;
      const len = this.buf.startsWith('\r\n', nl) ? 2 : 1;
      const line = this.buf.slice(0, nl);
      this.buf = this.buf.slice(nl + len);
      const ev = this.line(line);
      if (ev) out.push(ev);
    }
    return out;
  }

  /** End of stream: an unterminated last frame still counts. */
  end(): SseEvent[] {
    const out: SseEvent[] = [];
    if (this.buf) {
      const ev = this.line(this.buf);
      this.buf = '';
      if (ev) out.push(ev);
    }
    const ev = this.line('');
    if (ev) out.push(ev);
    return out;
  }

  private line(line: string): SseEvent | null {
    if (line === '') {
      if (this.data.length === 0) {
        this.event = null;
        return null;
      }
      const ev = { event: this.event, data: this.data.join('\n') };
      this.event = null;
      this.data = [];
      return ev;
    }
    if (line.startsWith(':')) return null;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') this.data.push(value);
    else if (field === 'event') this.event = value;
    return null;
  }
}

/** Reads a response body as SSE events until it ends or the signal aborts. */
export async function* readSse(body: ReadableStream<Uint8Array>): AsyncGenerator<SseEvent> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser();
  let finished = false;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        finished = true;
        break;
      }
      yield* parser.push(decoder.decode(value, { stream: true }));
    }
    yield* parser.push(decoder.decode());
    yield* parser.end();
  } finally {
    // A consumer that stops early cancels the body (and so the request).
    if (!finished) reader.cancel().catch(() => {});
    else reader.releaseLock();
  }
}
