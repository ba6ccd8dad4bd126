// The server's HTTP API as the UI uses it. Same-origin relative URLs only:
// the shoal binary serves this UI at `/` next to `/v1`.

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details?: { cached_tokens?: number } | null;
  completion_tokens_details?: { reasoning_tokens?: number } | null;
}

export interface ModelInfo {
  id: string;
  shoal?: { context_length?: number };
}

export interface LedgerEntry {
  id: string;
  dialect: string;
  model: string;
  created: number;
  stream: boolean;
  finish_reasons: string[];
  usage: Record<string, unknown>;
  ttft_ms: number;
  decode_tokens_per_s: number;
  prefill_tokens_per_s: number;
  /** The engine's own reason per choice (`stop_sequence`, `cancelled`, …). */
  engine_finish_reasons?: string[];
  /** The stop sequence that matched, per choice. */
  stop_sequences?: (string | null)[];
}

export interface ClusterNode {
  id: string;
  name: string;
  address: string;
  self: boolean;
  status: 'online' | 'unreachable' | string;
  os: string;
  cpu: { model: string; cores: number; usage_percent: number };
  memory: { total_bytes: number; used_bytes: number };
  accelerator: string | null;
  backend: 'cpu' | 'metal' | string;
  models: { id: string; memory_bytes: number }[];
  requests: { in_flight: number; queued: number };
  last_seen_ms: number;
}

/** An error the server (or the network) reported, with the server's own message. */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number | null,
  ) {
    super(message);
  }
}

/** The message of a `{"error": {"message"}}` body (OpenAI and Anthropic shapes), or the text itself. */
export function errorMessage(body: string): string {
  try {
    const j = JSON.parse(body);
    const m = j?.error?.message ?? j?.message;
    if (typeof m === 'string' && m) return m;
  } catch {
    /* not JSON */
  }
  return body.trim().slice(0, 500);
}

export async function apiError(res: Response): Promise<ApiError> {
  let text = '';
  try {
    text = await res.text();
  } catch {
    /* body unreadable */
  }
  const msg = errorMessage(text) || res.statusText || 'request failed';
  return new ApiError(`${res.status}: ${msg}`, res.status);
}

export async function getJson<T>(url: string, signal?: AbortSignal): Promise<T> {
  let res: Response;
  try {
    res = await fetch(url, { signal, headers: { accept: 'application/json' } });
  } catch (e) {
    if ((e as Error).name === 'AbortError') throw e;
    throw new ApiError(`cannot reach the server (${(e as Error).message})`, null);
  }
  if (!res.ok) throw await apiError(res);
  return (await res.json()) as T;
}

export const listModels = () => getJson<{ data: ModelInfo[] }>('/v1/models').then((r) => r.data ?? []);

export const usageLedger = (limit: number) =>
  getJson<{ data: LedgerEntry[] }>(`/v1/usage?limit=${limit}`).then((r) => r.data ?? []);

export const clusterNodes = () => getJson<{ nodes: ClusterNode[] }>('/v1/cluster/nodes').then((r) => r.nodes ?? []);

/** The ledger entry for one response id, waiting briefly for the server to record it. */
export async function ledgerEntry(id: string, timeoutMs = 3000): Promise<LedgerEntry | null> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const hit = (await usageLedger(50)).find((e) => e.id === id);
      if (hit) return hit;
    } catch {
      /* retried below */
    }
    if (Date.now() > deadline) return null;
    await new Promise((r) => setTimeout(r, 150));
  }
}
