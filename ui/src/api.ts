// The server's HTTP API as the UI uses it. Same-origin relative URLs only:
// the shoal binary serves this UI at `/` next to `/v1`. Every request goes
// through `apiFetch` (auth.ts), which adds the API key when the server wants one.
import { apiFetch } from './auth';
import { readSse } from './sse';

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details?: { cached_tokens?: number; cached_disk_tokens?: number; image_tokens?: number } | null;
  completion_tokens_details?: { reasoning_tokens?: number } | null;
}

/** Where a local model came from: pulled from a hub, or a path in the server's config. */
export type ModelSource = { kind: 'hub'; repo: string; commit: string } | { kind: 'path' };

/** Shoal's own fields of a `/v1/models` entry (an alias has only `alias_of`). */
export interface ModelDetails {
  alias_of?: string;
  architecture?: string | null;
  quantization?: string | null;
  context_length?: number | null;
  format?: string;
  parameters?: number;
  size_bytes?: number;
  path?: string;
  source?: ModelSource;
  estimated_memory_bytes?: number;
  /** `embedding`: answers /v1/embeddings and /api/embed, never a chat. */
  kind?: 'chat' | 'embedding';
  /** An embedding model's vectors: length, pooling, and the longest input. */
  embedding?: { dimensions?: number | null; pooling?: string; max_input_tokens?: number | null } | null;
  /** The engine it runs on (or would): `mlx` or `llama`; null when neither can. */
  backend?: string | null;
  /** Why no backend can run it. */
  unavailable?: string | null;
  /** KV cells reserved up front (llama.cpp). */
  kv_cache_bytes?: number | null;
  /** What the loaded model's template and vocabulary can do (null until it is loaded). */
  capabilities?: {
    chat: boolean;
    thinking: boolean;
    tools: boolean;
    harmony: boolean;
    system_role: boolean;
    /** The model can reason (a thinking switch, harmony, or a `</think>` token). */
    reasoning?: boolean;
    /** Reads images (a GGUF with its vision projector). */
    vision?: boolean;
  } | null;
  /** What a request that leaves a sampling parameter out gets, and where it came from. */
  sampling_defaults?: Record<'temperature' | 'top_p' | 'top_k' | 'min_p' | 'repetition_penalty', {
    value: number;
    source: string;
  }>;
  loaded?: boolean;
  memory_bytes?: number | null;
  dtype?: string | null;
  device?: string | null;
}

export interface ModelInfo {
  id: string;
  object?: string;
  created?: number;
  owned_by?: string;
  shoal?: ModelDetails;
}

/** `GET /v1/models`: the models, then the server's memory and disk figures. */
export interface ModelList {
  data: ModelInfo[];
  shoal?: {
    memory_budget_bytes?: number;
    memory_loaded_bytes?: number;
    /** Bytes the pulled models take on disk. */
    library_bytes?: number;
    library_path?: string;
  };
}

/** The events of `POST /v1/models/pull`, in order: plan, progress…, file_done per file, then done or error. */
export type PullEvent =
  | { type: 'plan'; repo: string; revision: string; commit: string; files: { name: string; size: number }[]; total_bytes: number }
  | { type: 'progress'; file: string; file_bytes: number; file_total: number; bytes: number; total_bytes: number }
  | { type: 'file_done'; file: string; verified: boolean; cached: boolean }
  | { type: 'done'; model: ModelInfo | null }
  | { type: 'error'; error: { message: string; type?: string; code?: string | null } };

export interface LedgerEntry {
  id: string;
  dialect: string;
  model: string;
  created: number;
  stream: boolean;
  finish_reasons: string[];
  usage: Record<string, unknown>;
  /** The usage's counts in no dialect's words (absent from rows copied off an older node). */
  tokens?: { prompt: number; cached: number; completion: number; reasoning: number; total: number };
  ttft_ms: number;
  decode_tokens_per_s: number;
  prefill_tokens_per_s: number;
  /** Speculative decoding: draft tokens checked and kept (absent from older rows). */
  draft_tokens?: number;
  draft_accepted?: number;
  /** The engine's own reason per choice (`stop_sequence`, `cancelled`, …). */
  engine_finish_reasons?: string[];
  /** The stop sequence that matched, per choice. */
  stop_sequences?: (string | null)[];
  /** The HTTP status the response went out with. */
  status?: number;
  /** The API key's name. */
  client?: string | null;
  /** The node that received the request. */
  node?: string | null;
  /** Why a refused request was refused. */
  error?: string | null;
  /** Continue a listing after this entry. */
  cursor?: number;
  /** What it would have cost at the server's prices (present only when prices are set; null: its model has none). */
  cost?: UsageCost | null;
}

/** What tokens would have cost at the server's `[prices.MODEL]` (in the prices' own unit). */
export interface UsageCost {
  input: number;
  cached_input: number;
  output: number;
  total: number;
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
  models: { id: string; memory_bytes: number; backend?: string }[];
  requests: { in_flight: number; queued: number };
  last_seen_ms: number;
}

/** An error the server (or the network) reported, with the server's own message. */
export class ApiError extends Error {
  /** The server's own words, without the HTTP status `message` leads with. */
  readonly detail: string;
  constructor(
    message: string,
    readonly status: number | null,
    detail?: string,
  ) {
    super(message);
    this.detail = detail ?? message;
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
  return new ApiError(`${res.status}: ${msg}`, res.status, msg);
}

export async function getJson<T>(url: string, signal?: AbortSignal): Promise<T> {
  let res: Response;
  try {
    res = await apiFetch(url, { signal, headers: { accept: 'application/json' } });
  } catch (e) {
    if ((e as Error).name === 'AbortError') throw e;
    throw new ApiError(`cannot reach the server (${(e as Error).message})`, null);
  }
  if (!res.ok) throw await apiError(res);
  return (await res.json()) as T;
}

export const listModels = () => getJson<ModelList>('/v1/models');

/** `/v1/models/{id}`: ids keep their slashes, each segment encoded. */
export function modelPath(id: string): string {
  return `/v1/models/${id.split('/').map(encodeURIComponent).join('/')}`;
}

/** A request with an optional JSON body; rejects with the server's message unless it answered 2xx. */
async function request(method: string, url: string, body?: unknown, signal?: AbortSignal): Promise<Response> {
  let res: Response;
  try {
    res = await apiFetch(url, {
      method,
      signal,
      headers: body === undefined ? { accept: 'application/json' } : { accept: 'application/json', 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    if ((e as Error).name === 'AbortError') throw e;
    throw new ApiError(`cannot reach the server (${(e as Error).message})`, null);
  }
  if (!res.ok) throw await apiError(res);
  return res;
}

/** The switch for Ollama's own port (11434) beside this one, and what listening on it gave. */
export interface OllamaPortSetting {
  enabled: boolean;
  port: number;
  listening: boolean;
  /** Where it listens, when it does. */
  address?: string;
  /** Why it does not (the port is taken, by a running Ollama for example). */
  error?: string;
}

export const getOllamaPort = () => getJson<OllamaPortSetting>('/v1/settings/ollama-port');

/** Turns Ollama's port on or off now; the server remembers it for its next start. */
export const setOllamaPort = (enabled: boolean, port?: number) =>
  request('PUT', '/v1/settings/ollama-port', port === undefined ? { enabled } : { enabled, port }).then(
    (r) => r.json() as Promise<OllamaPortSetting>,
  );

/** The prefix cache: RAM per loaded model, and the disk tier (null when off). */
export interface CacheState {
  ram: { bytes: number; models: { model: string; bytes: number }[] };
  disk: { dir: string; budget_bytes: number; bytes: number; entries: number; writes_paused: boolean; last_error: string | null; hits: number } | null;
  entries?: { model: string; tokens: number; bytes: number; last_used: number }[];
}

export const getCache = () => getJson<CacheState>('/v1/cache');

/** Empties the disk tier now and each model's RAM entries before its next request. */
export const clearCache = () =>
  request('DELETE', '/v1/cache').then((r) => r.json() as Promise<{ disk_entries_removed: number; ram_cleared_for: string[] }>);

/** Loads a model into memory; 503 (`insufficient_memory`) when it does not fit. */
/** A chat completion, not streamed (the title a model writes for its chat). */
export interface ChatCompletion {
  id?: string;
  model?: string;
  choices?: { message?: { content?: string | null } }[];
  usage?: Usage;
}
export const completeChat = (body: Record<string, unknown>) =>
  request('POST', '/v1/chat/completions', body).then((r) => r.json() as Promise<ChatCompletion>);

export const loadModel = (id: string) => request('POST', `${modelPath(id)}/load`).then((r) => r.json() as Promise<ModelInfo>);

export const unloadModel = (id: string) => request('POST', `${modelPath(id)}/unload`).then((r) => r.json() as Promise<ModelInfo>);

/** Deletes a pulled model's files; the server refuses (400) for the configured model. */
export const deleteModel = (id: string) =>
  request('DELETE', modelPath(id)).then((r) => r.json() as Promise<{ id: string; deleted: boolean; shoal?: { freed_bytes?: number } }>);

/**
 * Pulls `org/name[@rev]` (and `file`, for a repo with several GGUFs) from the
 * server's hub, calling `onEvent` for each event of the stream. Rejects with
 * the server's message when it refuses the request (HTTP 400 and the like);
 * a failure during the download arrives as an `error` event. A stream that
 * ends without `done` or `error` reports an `error` event too.
 */
export async function pullModel(
  model: string,
  file: string | undefined,
  onEvent: (ev: PullEvent) => void,
  signal?: AbortSignal,
): Promise<void> {
  const body: { model: string; file?: string } = { model };
  if (file) body.file = file;
  const res = await request('POST', '/v1/models/pull', body, signal);
  if (!res.body) throw new ApiError('the server sent no progress stream', res.status);
  let ended = false;
  for await (const frame of readSse(res.body)) {
    let ev: PullEvent;
    try {
      ev = JSON.parse(frame.data) as PullEvent;
    } catch {
      continue;
    }
    // The event name and the `type` field say the same; trust the name if they differ.
    if (frame.event && frame.event !== ev.type) (ev as { type: string }).type = frame.event;
    if (ev.type === 'done' || ev.type === 'error') ended = true;
    onEvent(ev);
  }
  if (!ended) onEvent({ type: 'error', error: { message: 'the download stream ended before the pull finished' } });
}

export const usageLedger = (limit: number) =>
  getJson<{ data: LedgerEntry[] }>(`/v1/usage?limit=${limit}`).then((r) => r.data ?? []);

/** `/v1/usage`'s filters, as the server takes them (`since` / `until`: seconds, `today`, `24h` …). */
export interface UsageFilters {
  since?: string;
  until?: string;
  model?: string;
  client?: string;
  dialect?: string;
  finish?: string;
  /** `cluster`: every online node's ledger merged. */
  scope?: string;
  /** One chat turn's requests (`x-shoal-turn`): a tool loop's model turns, a continued reply's steps. */
  turn?: string;
}

/** One `group_by` sum. */
export interface UsageGroup {
  key: string;
  requests: number;
  prompt_tokens: number;
  cached_tokens: number;
  completion_tokens: number;
  reasoning_tokens: number;
  total_tokens: number;
  /** Present only when the server has prices. */
  cost?: UsageCost;
}

/** `group_by` sums, and with prices set their total cost and the models without a price. */
export interface UsageSums {
  data: UsageGroup[];
  cost?: UsageCost;
  unpriced_models?: string[];
}

/** An API key's use against its limits (`/v1/usage/keys`). */
export interface KeyUse {
  name: string;
  tokens_today: number;
  tokens_per_day: number | null;
  requests_last_minute: number;
  requests_per_minute: number | null;
}

/** The query string of `f` plus `extra`, empty filters left out. */
export function usageQuery(f: UsageFilters, extra: Record<string, string> = {}): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries({ ...f, ...extra })) if (v) q.set(k, v);
  return q.toString();
}

export const usagePage = (f: UsageFilters, limit: number, cursor?: number) =>
  getJson<{ data: LedgerEntry[]; has_more: boolean; next_cursor: number | null }>(
    `/v1/usage?${usageQuery(f, { limit: String(limit), cursor: cursor == null ? '' : String(cursor) })}`,
  );

export type GroupBy = 'day' | 'hour' | 'week' | 'model' | 'client' | 'dialect' | 'node' | 'served_by' | 'finish';

export const usageSums = (f: UsageFilters, by: GroupBy) =>
  getJson<UsageSums>(`/v1/usage?${usageQuery(f, { group_by: by })}`).then((r) => ({ ...r, data: r.data ?? [] }));

export const usageGroups = (f: UsageFilters, by: GroupBy) => usageSums(f, by).then((r) => r.data);

/** The dialects the server speaks, by their ledger names. */
export const dialects = () => getJson<{ data: { name: string }[] }>('/v1/dialects').then((r) => (r.data ?? []).map((d) => d.name));

export const usageKeys = () => getJson<{ data: KeyUse[] }>('/v1/usage/keys').then((r) => r.data ?? []);

/** Every entry `f` selects, as the server's CSV. */
export const usageCsv = (f: UsageFilters) => request('GET', `/v1/usage?${usageQuery(f, { format: 'csv' })}`).then((r) => r.text());

export const clusterNodes = () => getJson<{ nodes: ClusterNode[] }>('/v1/cluster/nodes').then((r) => r.nodes ?? []);

/**
 * The ledger entry for one response id. The server answers once the request
 * is recorded, waiting while it is still winding down (a stopped stream is
 * recorded when the engine has stopped it); null when it holds no such request.
 */
export async function ledgerEntry(id: string): Promise<LedgerEntry | null> {
  try {
    return await getJson<LedgerEntry>(`/v1/usage/${encodeURIComponent(id)}`);
  } catch {
    return null;
  }
}

/** A model the hub's search found (`GET /v1/hub/search`). */
export interface HubRepo {
  id: string;
  downloads: number;
  likes: number;
  gguf: boolean;
}

/** A model a hub repository offers, with the pool's estimate once loaded (`GET /v1/hub/files`). */
export interface HubFile {
  name: string;
  kind: 'gguf' | 'directory';
  size_bytes: number;
  quantization: string | null;
  estimated_memory_bytes: number | null;
  fits: boolean | null;
  /** Why this server could not run the file, when it could not. */
  unavailable: string | null;
  pull: { model: string; file: string | null };
}

export interface HubFiles {
  repo: string;
  revision: string;
  commit: string;
  memory_budget_bytes: number;
  architecture: string | null;
  context_length: number | null;
  files: HubFile[];
}

export const hubSearch = (q: string) =>
  getJson<{ data: HubRepo[] }>(`/v1/hub/search?q=${encodeURIComponent(q)}`).then((r) => r.data ?? []);

export const hubFiles = (repo: string) => getJson<HubFiles>(`/v1/hub/files?repo=${encodeURIComponent(repo)}`);

/** An MCP server of the server's `mcp.json`, as `/v1/mcp/servers` lists it. */
export interface McpServer {
  name: string;
  transport: 'stdio' | 'http';
  state: 'ready' | 'failed' | 'disabled';
  error?: string;
  tools: number;
}

export interface McpServers {
  data: McpServer[];
  /** Where the file is kept (null: in memory only). */
  path: string | null;
  timeout_secs: number;
  max_result_chars: number;
}

/** A tool one of them offers, with the function tool a chat request carries. */
export interface McpTool {
  server: string;
  name: string;
  /** What the model calls it: `server__name`. */
  function: string;
  title?: string;
  description: string;
  read_only: boolean;
  /** The user allowed it for good: the server keeps the answer (`alwaysAllow` in mcp.json). */
  always_allow?: boolean;
  tool: { type: 'function'; function: { name: string; description: string; parameters: unknown } };
}

/** What a tool call gave. */
export interface McpOutcome {
  content: string;
  is_error: boolean;
  truncated: boolean;
  chars: number;
  took_ms: number;
}

export const mcpServers = () => getJson<McpServers>('/v1/mcp/servers');
export const mcpTools = () => getJson<{ data: McpTool[] }>('/v1/mcp/tools').then((r) => r.data ?? []);
export const mcpConfig = () => getJson<Record<string, unknown>>('/v1/mcp/config');
export const setMcpConfig = (file: unknown) =>
  request('PUT', '/v1/mcp/config', file).then((r) => r.json() as Promise<Record<string, unknown>>);
/** Keeps (or withdraws) the user's "Always allow" for a tool, on the server. */
export const setMcpAlwaysAllow = (fn: string, allow: boolean) =>
  request('PUT', '/v1/mcp/always_allow', { function: fn, allow }).then((r) => r.json() as Promise<unknown>);
/** Forgets every "Always allow" answer; returns how many there were. */
export const forgetMcpAlwaysAllow = () =>
  request('DELETE', '/v1/mcp/always_allow').then((r) => r.json() as Promise<{ forgotten: number }>);
/** Runs a tool the model called: by its function name, with the arguments the model wrote. */
export const callMcpTool = (fn: string, args: string, signal?: AbortSignal) =>
  request('POST', '/v1/mcp/call', { function: fn, arguments: args }, signal).then((r) => r.json() as Promise<McpOutcome>);
