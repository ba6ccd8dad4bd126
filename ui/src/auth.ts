// The API key, for a server started with `--api-key`. The one place that adds
// it to requests: every call to the server's API goes through `apiFetch`. A 401
// opens the key prompt (`components/KeyPrompt.tsx`) and the request waits; once
// a key the server accepts is entered, the waiting requests are sent again with
// it. A server that wants no key never answers 401, so no prompt appears.
//
// The key is kept in this origin's localStorage and only ever put in the
// `Authorization` header: never in a URL, the page's text or a log line.
import { createSignal } from 'solid-js';

const STORAGE = 'shoal.apiKey';

function readStored(): string | null {
  try {
    return localStorage.getItem(STORAGE) || null;
  } catch {
    return null;
  }
}

function writeStored(k: string | null): void {
  try {
    if (k == null) localStorage.removeItem(STORAGE);
    else localStorage.setItem(STORAGE, k);
  } catch {
    /* storage unavailable: the key lasts as long as the page */
  }
}

let key: string | null = readStored();
const [hasKey, setHasKey] = createSignal(key != null);

/** The prompt while it is shown; `refused` is the server's message when it turned down the key it had. */
export interface KeyRequest {
  refused: string | null;
}
const [keyRequest, setKeyRequest] = createSignal<KeyRequest | null>(null);

export { hasKey, keyRequest };

/** Requests waiting for a key. */
let waiters: (() => void)[] = [];

function useKey(k: string | null): void {
  key = k;
  setHasKey(k != null);
}

function wake(): void {
  const w = waiters;
  waiters = [];
  for (const f of w) f();
}

// Another tab of this origin entered or forgot the key.
window.addEventListener('storage', (e) => {
  if (e.key !== STORAGE && e.key !== null) return;
  useKey(readStored());
  if (key != null && keyRequest()) {
    setKeyRequest(null);
    wake();
  }
});

function abortError(): DOMException {
  return new DOMException('The operation was aborted.', 'AbortError');
}

function waitForKey(signal?: AbortSignal | null): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortError());
    const onAbort = () => {
      waiters = waiters.filter((w) => w !== done);
      reject(abortError());
    };
    const done = () => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    };
    waiters.push(done);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** The `error.message` of an OpenAI- or Anthropic-shaped error body, if any. */
function refusal(body: string): string {
  try {
    const m = JSON.parse(body)?.error?.message;
    if (typeof m === 'string') return m;
  } catch {
    /* not JSON */
  }
  return '';
}

function withKey(init: RequestInit, k: string | null): RequestInit {
  if (k == null) return init;
  const headers = new Headers(init.headers);
  headers.set('authorization', `Bearer ${k}`);
  return { ...init, headers };
}

/**
 * `fetch` for the server's API: adds the key, and on a 401 waits for the
 * prompt to get one the server accepts, then sends the request again. Rejects
 * like `fetch` (an `AbortError` when `init.signal` aborts, also while waiting).
 */
export async function apiFetch(url: string, init: RequestInit = {}): Promise<Response> {
  for (;;) {
    const sent = key;
    const res = await fetch(url, withKey(init, sent));
    if (res.status !== 401) return res;
    const message = refusal(await res.text().catch(() => ''));
    // A key entered meanwhile: try that one.
    if (key !== sent) continue;
    if (sent != null) {
      // The key kept here is not (or no longer) one of the server's.
      useKey(null);
      writeStored(null);
    }
    if (!keyRequest() || sent != null) setKeyRequest({ refused: sent != null ? message || 'the server refused the key' : null });
    await waitForKey(init.signal);
  }
}

/** Printable ASCII only: anything else cannot be sent in a header. */
const KEY_CHARS = /^[\x20-\x7e]+$/;

/**
 * Tries a key on the server; if it is accepted, keeps it, closes the prompt and
 * sends the waiting requests again. Resolves with why it was not taken (the
 * server's message for a wrong key), or null once it is.
 */
export async function submitKey(candidate: string): Promise<string | null> {
  const k = candidate.trim();
  if (!k) return 'Enter the API key.';
  if (!KEY_CHARS.test(k)) return 'An API key is made of printable ASCII characters only.';
  let res: Response;
  try {
    res = await fetch('/v1/usage?limit=1', { headers: { accept: 'application/json', authorization: `Bearer ${k}` } });
  } catch (e) {
    return `cannot reach the server (${(e as Error).message})`;
  }
  if (res.status === 401) {
    const m = refusal(await res.text().catch(() => ''));
    return m || 'the server refused the key';
  }
  useKey(k);
  writeStored(k);
  setKeyRequest(null);
  wake();
  return null;
}

/** Drops the key from this browser. The caller reloads the page, which asks again if the server wants one. */
export function forgetKey(): void {
  useKey(null);
  writeStored(null);
}
