// Conversations and their per-chat settings. The only module that knows where
// they live: the server's conversation store (SQLite, shared with `shoal chat`
// and `shoal history`) behind /v1/conversations. It maps the server's records
// to the UI's types (below, and a message's in `message.ts`, re-exported here) and
// back; everything else goes through the async functions at the end.
import { apiError, ApiError } from './api';
import { apiFetch } from './auth';
import { finishFromApi, type Finish } from './finish';
import type { ImageAttachment, Message, ReplyStats, ReplyStep, ReplyVersion, ToolUse } from './message';
import { applyVersion } from './reply';
import { toTitleInfo, type TitleInfo } from './title';

export interface ChatSettings {
  model: string;
  systemPrompt: string;
  /** Empty: the server's default. */
  temperature: number | null;
  /** Empty: the server's default. */
  maxTokens: number | null;
  /** Sampling overrides (sent as top_p, top_k, min_p, repetition_penalty, seed); empty: the model's default. */
  topP: number | null;
  topK: number | null;
  minP: number | null;
  repetitionPenalty: number | null;
  seed: number | null;
  stop: string[];
  reasoning: boolean;
  /** Offer the model the tools of the server's MCP servers. */
  tools: boolean;
  /** `required`: the model must call a tool in each step (a small model's way to use them). */
  toolChoice: 'auto' | 'required';
  /** Run tools their server marks read-only without asking. */
  autoReadOnly: boolean;
  /** The most model turns one reply's tool loop may take. */
  toolSteps: number;
}

export type { ImageAttachment, Message, ReplyStats, ReplyStep, ReplyVersion, SaveState, ToolUse } from './message';

export interface Conversation {
  /** The UI's key; the server's id as a string for conversations loaded from the store. */
  id: string;
  /** The store's id, once created. */
  serverId: number | null;
  title: string;
  created: number;
  updated: number;
  settings: ChatSettings;
  messages: Message[];
  /** The title was written by the model: that request's id and cost. */
  titleBy?: TitleInfo;
}

/**
 * Replies in a new chat stop at this many tokens unless the settings say
 * otherwise: a small model that rambles would otherwise run to the end of its
 * context window. Cleared, the server's limit (the context window) applies.
 */
export const DEFAULT_MAX_TOKENS = 1024;

export const DEFAULT_SETTINGS: ChatSettings = {
  model: '',
  systemPrompt: '',
  temperature: null,
  maxTokens: DEFAULT_MAX_TOKENS,
  topP: null,
  topK: null,
  minP: null,
  repetitionPenalty: null,
  seed: null,
  stop: [],
  reasoning: false,
  tools: false,
  toolChoice: 'auto',
  autoReadOnly: false,
  toolSteps: 5,
};

export const NEW_TITLE = 'New chat';

// ---- The server's records -------------------------------------------------

interface StoredPiece {
  kind: 'text' | 'error' | string;
  text: string;
  metadata?: Record<string, unknown> | null;
  /** Absent: 0. */
  version?: number;
  step?: number;
}

interface StoredMessage {
  id: number;
  conversation_id: number;
  seq: number;
  role: 'user' | 'assistant' | string;
  target: string | null;
  model: string | null;
  created_ms?: number;
  pieces: StoredPiece[];
}

interface StoredConversation {
  id: number;
  title: string;
  created_ms: number;
  updated_ms: number;
  settings: Record<string, unknown> | null;
  messages?: StoredMessage[];
}

/**
 * Keys the UI writes into an assistant piece's metadata for what only the
 * browser knows. The server writes the reserved keys (`finish_reason`,
 * `token_usage_*`, …) itself from its request ledger.
 */
export interface ClientMetadata {
  /** Why the reply ended as the UI saw it; used when the server has no ledger entry. */
  client_finish: Finish;
  client_ttft_ms?: number;
  client_tok_per_s?: number;
  /** Where the figures shown came from (`stream`: the usage chunk, `ledger`: looked up after a cancel). */
  client_usage_source?: 'stream' | 'ledger';
  /** The live count of deltas, kept only when no usage was known. */
  client_live_completion?: number;
  /** The user's words this version answered, when that message was edited since. */
  answered?: string;
  /** The step's tool calls and their results (MCP). */
  tool_uses?: ToolUse[];
  /** The chat turn the step's request served (`x-shoal-turn`, the ledger's `turn`). */
  turn?: string;
}

export interface AssistantRecord {
  content: string;
  reasoning?: string;
  responseId?: string;
  error?: string;
  metadata: ClientMetadata;
}

// ---- Mapping --------------------------------------------------------------

const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);
const str = (v: unknown): string | null => (typeof v === 'string' && v !== '' ? v : null);

function toSettings(raw: unknown): ChatSettings {
  const s = raw && typeof raw === 'object' ? (raw as Record<string, unknown>) : {};
  return {
    model: typeof s.model === 'string' ? s.model : DEFAULT_SETTINGS.model,
    systemPrompt: typeof s.systemPrompt === 'string' ? s.systemPrompt : DEFAULT_SETTINGS.systemPrompt,
    temperature: num(s.temperature),
    maxTokens: num(s.maxTokens),
    topP: num(s.topP),
    topK: num(s.topK),
    minP: num(s.minP),
    repetitionPenalty: num(s.repetitionPenalty),
    seed: num(s.seed),
    stop: Array.isArray(s.stop) ? s.stop.filter((x): x is string => typeof x === 'string') : [],
    reasoning: s.reasoning === true,
    tools: s.tools === true,
    toolChoice: s.toolChoice === 'required' ? 'required' : 'auto',
    autoReadOnly: s.autoReadOnly === true,
    toolSteps: num(s.toolSteps) ?? DEFAULT_SETTINGS.toolSteps,
  };
}

/**
 * Why a stored reply ended: the engine's own reason when the server had a
 * ledger entry for it, else the dialect's word, else what the UI saw.
 */
function storedFinish(meta: Record<string, unknown>, kind: string): Finish {
  if (str(meta.error) || kind === 'error') return 'error';
  const engine = str(meta.engine_finish_reason);
  if (engine === 'context_window') return 'length';
  if (engine) return finishFromApi(engine);
  const reason = str(meta.finish_reason);
  if (reason) return str(meta.stop_sequence) && reason === 'stop' ? 'stop_sequence' : finishFromApi(reason);
  return finishFromApi(str(meta.client_finish));
}

/** Draft counts worth showing: some were checked. */
export function draftStats(checked: number | null | undefined, kept: number | null | undefined): ReplyStats['drafts'] {
  return checked != null && checked > 0 ? { checked, kept: kept ?? 0 } : null;
}

function storedStats(meta: Record<string, unknown>): ReplyStats | undefined {
  const prompt = num(meta.token_usage_prompt_tokens);
  const completion = num(meta.token_usage_completion_tokens);
  // The server's timings when it recorded the reply; the browser's otherwise.
  const ttftMs = num(meta.ttft_ms) ?? num(meta.client_ttft_ms);
  const serverRate = num(meta.decode_tokens_per_s);
  const tokPerS = serverRate != null && serverRate > 0 ? serverRate : num(meta.client_tok_per_s);
  if (completion != null) {
    return {
      prompt,
      // The API always reports these two (0 when none); absent here means not reported.
      cached: num(meta.token_usage_cached_tokens) ?? (prompt != null ? 0 : null),
      cachedDisk: num(meta.cached_disk_tokens) ?? 0,
      image: num(meta.image_tokens) ?? 0,
      completion,
      reasoning: num(meta.token_usage_reasoning_tokens) ?? 0,
      total: num(meta.token_usage_total_tokens),
      live: false,
      source: meta.client_usage_source === 'stream' ? 'stream' : 'ledger',
      ttftMs,
      tokPerS,
      drafts: draftStats(num(meta.draft_tokens), num(meta.draft_accepted)),
    };
  }
  const liveCount = num(meta.client_live_completion);
  if (liveCount == null) return undefined;
  return {
    prompt: null,
    cached: null,
    completion: liveCount,
    reasoning: null,
    total: null,
    live: true,
    source: 'live',
    ttftMs,
    tokPerS,
  };
}

const TOOL_STATES = ['asking', 'running', 'done', 'denied', 'failed', 'skipped'];

/** A step's tool calls as the UI wrote them into its metadata (`tool_uses`). */
function toolUses(raw: unknown): ToolUse[] {
  if (!Array.isArray(raw)) return [];
  return raw.flatMap((t): ToolUse[] => {
    if (!t || typeof t !== 'object' || typeof t.id !== 'string' || typeof t.name !== 'string') return [];
    // A call still waiting when the page went away never ran.
    const state = TOOL_STATES.includes(t.state) && t.state !== 'asking' && t.state !== 'running' ? t.state : 'skipped';
    return [{ ...t, arguments: typeof t.arguments === 'string' ? t.arguments : '', state }];
  });
}

/** One stored piece of a reply as the step it is. */
function toStep(piece: StoredPiece, model: string | null, created: number | undefined): ReplyStep {
  const meta = piece.metadata && typeof piece.metadata === 'object' ? piece.metadata : {};
  const error = str(meta.error) ?? (piece.kind === 'error' ? str(piece.text) : null);
  const finish = storedFinish(meta, piece.kind);
  const step: ReplyStep = {
    // An error piece whose text is the error itself carries no reply text.
    content: error && piece.text === error ? '' : (piece.text ?? ''),
    reasoning: str(meta.reasoning_content) ?? '',
    responseId: str(meta.response_id) ?? undefined,
    model: model ?? undefined,
    finish,
    stats: storedStats(meta),
    created,
  };
  if (error) step.error = error;
  const tools = toolUses(meta.tool_uses);
  if (tools.length) step.tools = tools;
  const seq = str(meta.stop_sequence);
  if (finish === 'stop_sequence' && seq) step.stopSequence = seq;
  const turn = str(meta.turn);
  if (turn) step.turn = turn;
  return step;
}

function toMessage(m: StoredMessage): Message {
  const pieces = Array.isArray(m.pieces) ? m.pieces : [];
  const base: Message = {
    id: String(m.id),
    serverId: m.id,
    saved: 'saved',
    role: m.role === 'assistant' ? 'assistant' : 'user',
    content: pieces[0]?.text ?? '',
    created: m.created_ms,
  };
  if (base.role === 'user') {
    const images = storedImages(pieces[0]?.metadata);
    if (images.length) base.images = images;
    return base;
  }
  // The pieces come in the store's order (version, step); each version a list of steps.
  const versions = new Map<number, ReplyVersion>();
  for (const p of pieces) {
    const n = p.version ?? 0;
    let v = versions.get(n);
    if (!v) {
      v = { version: n, steps: [] };
      const answered = str(p.metadata?.answered);
      if (answered) v.answered = answered;
      versions.set(n, v);
    }
    v.steps.push(toStep(p, m.model, m.created_ms));
  }
  const all = [...versions.values()].sort((a, b) => a.version - b.version);
  const msg: Message = { ...base, content: '', storedParts: pieces.length };
  // The newest version is the one shown.
  const newest = all.pop() ?? { version: 0, steps: [toStep({ kind: 'text', text: '' }, m.model, m.created_ms)] };
  applyVersion(msg, newest);
  if (all.length) msg.versions = all;
  return msg;
}

function toConversation(c: StoredConversation): Conversation {
  const messages = Array.isArray(c.messages) ? [...c.messages].sort((a, b) => a.seq - b.seq) : [];
  return {
    id: String(c.id),
    serverId: c.id,
    title: c.title || NEW_TITLE,
    created: c.created_ms,
    updated: c.updated_ms,
    settings: toSettings(c.settings),
    messages: messages.map(toMessage),
    titleBy: toTitleInfo(c.settings?.titleBy),
  };
}

// ---- HTTP -------------------------------------------------------------------

/** An error from the conversation store, worded for the page. */
export class StoreError extends ApiError {}

async function call<T>(method: string, url: string, body?: unknown): Promise<T> {
  let res: Response;
  try {
    res = await apiFetch(url, {
      method,
      headers: body === undefined ? { accept: 'application/json' } : { accept: 'application/json', 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    throw new StoreError(`cannot reach the server (${(e as Error).message})`, null);
  }
  if (!res.ok) {
    const e = await apiError(res);
    throw new StoreError(e.message, e.status);
  }
  try {
    return (await res.json()) as T;
  } catch {
    throw new StoreError(`${method} ${url}: the server's answer is not JSON`, res.status);
  }
}

// ---- The store --------------------------------------------------------------

/** All conversations with their messages, most recently updated first. */
export async function listConversations(): Promise<Conversation[]> {
  const r = await call<{ data: StoredConversation[] }>('GET', '/v1/conversations');
  return (Array.isArray(r?.data) ? r.data : []).map(toConversation).sort((a, b) => b.updated - a.updated);
}

/** What a chat keeps in the store's settings object: its settings, and who wrote its title. */
export type StoredSettings = ChatSettings & { titleBy?: TitleInfo };

/** Creates a conversation; resolves with the store's copy (no messages). */
export async function createConversation(title: string, settings: StoredSettings): Promise<Conversation> {
  return toConversation(await call<StoredConversation>('POST', '/v1/conversations', { title, settings }));
}

export async function updateConversation(
  serverId: number,
  patch: { title?: string; settings?: StoredSettings },
): Promise<Conversation> {
  return toConversation(await call<StoredConversation>('PATCH', `/v1/conversations/${serverId}`, patch));
}

export async function deleteConversation(serverId: number): Promise<void> {
  await call('DELETE', `/v1/conversations/${serverId}`);
}

/** An image as the store keeps it on a user piece (`metadata.images`), and as an exported chat has it. */
export function imageRecord(i: ImageAttachment): { media_type: string; data: string; name?: string } {
  return { media_type: i.mediaType, data: i.data, ...(i.name ? { name: i.name } : {}) };
}

export async function addUserMessage(serverId: number, content: string, images?: ImageAttachment[]): Promise<Message> {
  const body: Record<string, unknown> = { role: 'user', content };
  if (images?.length) body.metadata = { images: images.map(imageRecord) };
  return toMessage(await call<StoredMessage>('POST', `/v1/conversations/${serverId}/messages`, body));
}

/** A user piece's images as the UI stored them (`images` in its metadata). */
function storedImages(meta: Record<string, unknown> | null | undefined): ImageAttachment[] {
  const list = meta && Array.isArray(meta.images) ? meta.images : [];
  return list.flatMap((i: unknown) => {
    const o = i && typeof i === 'object' ? (i as Record<string, unknown>) : {};
    const mediaType = str(o.media_type);
    const data = str(o.data);
    if (!mediaType || !data) return [];
    const name = str(o.name);
    return [name ? { mediaType, data, name } : { mediaType, data }];
  });
}

/**
 * Stores a finished reply. The server fills its usage and finish reason from
 * its own ledger by response id; the returned message carries them.
 */
export async function addAssistantMessage(serverId: number, r: AssistantRecord): Promise<Message> {
  const body: Record<string, unknown> = { role: 'assistant', content: r.content, metadata: r.metadata };
  if (r.reasoning) body.reasoning = r.reasoning;
  if (r.responseId) body.response_id = r.responseId;
  if (r.error) body.error = r.error;
  return toMessage(await call<StoredMessage>('POST', `/v1/conversations/${serverId}/messages`, body));
}

/** Stores a step or a version of a reply already stored; the server fills its usage as for a reply. */
export async function addReplyPart(
  serverId: number,
  messageServerId: number,
  place: { version: number; step: number },
  r: AssistantRecord,
): Promise<Message> {
  const body: Record<string, unknown> = { content: r.content, metadata: r.metadata, version: place.version, step: place.step };
  if (r.reasoning) body.reasoning = r.reasoning;
  if (r.responseId) body.response_id = r.responseId;
  if (r.error) body.error = r.error;
  return toMessage(await call<StoredMessage>('POST', `/v1/conversations/${serverId}/messages/${messageServerId}/pieces`, body));
}

/** Replaces a user message's text (an edit); the reply after it keeps what its versions answered. */
export async function editUserMessage(serverId: number, messageServerId: number, content: string): Promise<void> {
  await call('PATCH', `/v1/conversations/${serverId}/messages/${messageServerId}`, { content });
}

/** Deletes a message and every later one in its conversation. */
export async function deleteMessagesFrom(serverId: number, messageServerId: number): Promise<number> {
  const r = await call<{ deleted?: number }>('DELETE', `/v1/conversations/${serverId}/messages/${messageServerId}`);
  return typeof r?.deleted === 'number' ? r.deleted : 0;
}
