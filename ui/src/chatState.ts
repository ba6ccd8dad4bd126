// The chat's state, kept outside the view so a reply keeps streaming into its
// conversation while another tab is shown.
//
// The page's state is the working copy; the server's conversation store
// (`store.ts`) is written behind it, one conversation's writes at a time and
// in order, so the page never waits on the store and nothing is written out
// of order (a chat is created before its messages, a user message before its
// reply). A write that fails is shown and tried again with the next one.
import { batch } from 'solid-js';
import { createStore, produce } from 'solid-js/store';
import { defaultPresetSettings } from './presets';
import { buildRequest, streamChat, usedTools, type StreamResult } from './chat';
import { ApiError, callMcpTool, forgetMcpAlwaysAllow, mcpTools, setMcpAlwaysAllow, type McpTool } from './api';
import {
  addAssistantMessage,
  addReplyPart,
  addUserMessage,
  createConversation,
  DEFAULT_SETTINGS,
  deleteConversation,
  deleteMessagesFrom,
  editUserMessage,
  listConversations,
  NEW_TITLE,
  updateConversation,
  type AssistantRecord,
  type ChatSettings,
  type Conversation,
  type ImageAttachment,
  type Message,
  type ReplyStep,
  type StoredSettings,
  type ToolUse,
} from './store';
import { askTitle, modelTitles } from './title';
import { beginStep, beginVersion, partsOf, showsNewest, stepsOf, switchVersion } from './reply';
import { chatModels, defaultModelId, loadModels, resolveModel } from './models';

export { loadModels };

interface ChatState {
  loaded: boolean;
  /** The conversations could not be loaded from the store. */
  loadError: string | null;
  /** The last write to the store that failed. */
  storeError: string | null;
  conversations: Conversation[];
  currentId: string | null;
  /** The store id the address named that no stored chat has (deleted, or never there). */
  missing: number | null;
  /** The reply being streamed, if any (one at a time). */
  streaming: { conversationId: string; messageId: string } | null;
}

/** Longest chat title kept (the first message, spaces folded). */
const TITLE_CHARS = 200;

const [state, setState] = createStore<ChatState>({
  loaded: false,
  loadError: null,
  storeError: null,
  conversations: [],
  currentId: null,
  missing: null,
  streaming: null,
});

export { state as chat };

let controller: AbortController | null = null;
let initStarted = false;

export function current(): Conversation | undefined {
  return state.conversations.find((c) => c.id === state.currentId);
}

function find(id: string): Conversation | undefined {
  return state.conversations.find((x) => x.id === id);
}

function snapshot(id: string): Conversation | undefined {
  const c = find(id);
  return c ? (JSON.parse(JSON.stringify(c)) as Conversation) : undefined;
}

function newKey(prefix: string): string {
  const r = crypto.getRandomValues(new Uint32Array(2));
  return `${prefix}-${Date.now().toString(36)}${r[0].toString(36)}${r[1].toString(36)}`;
}

// ---- Writing to the store ---------------------------------------------------

/** One conversation's link to the store. */
interface Sync {
  /** The store's id, once created. */
  serverId: number | null;
  /** Its writes, one after another. */
  chain: Promise<void>;
  /** A settings write is queued and will read the settings when it runs. */
  settingsQueued: boolean;
  /** UI message key → store id, kept after a message leaves the page (retry). */
  messageIds: Map<string, number>;
}

const syncs = new Map<string, Sync>();
/** Store ids of conversations deleted on this page (a list still in flight must not bring them back). */
const removed = new Set<number>();

function syncOf(convId: string): Sync {
  let s = syncs.get(convId);
  if (!s) {
    s = { serverId: find(convId)?.serverId ?? null, chain: Promise.resolve(), settingsQueued: false, messageIds: new Map() };
    syncs.set(convId, s);
  }
  return s;
}

function storeFailed(e: unknown): void {
  setState('storeError', `Could not save to the conversation store: ${(e as Error)?.message ?? String(e)}`);
}

/** Queues a write for one conversation; a failure is shown and does not stop later writes. */
function enqueue(convId: string, task: (s: Sync) => Promise<void>): Promise<void> {
  const s = syncOf(convId);
  const run = s.chain.then(() => task(s)).catch(storeFailed);
  s.chain = run;
  return run;
}

/** The conversation's store id, creating it first if needed; null if it left the page before that. */
async function ensureCreated(convId: string, s: Sync): Promise<number | null> {
  if (s.serverId != null) return s.serverId;
  const c = snapshot(convId);
  if (!c) return null;
  const made = await createConversation(c.title, storedSettings(c));
  s.serverId = made.serverId;
  setState('conversations', (x) => x.id === convId, 'serverId', made.serverId);
  return s.serverId;
}

/** A chat's settings as the store keeps them, with who wrote its title. */
function storedSettings(c: Conversation): StoredSettings {
  return c.titleBy ? { ...c.settings, titleBy: c.titleBy } : c.settings;
}

function saveTitle(convId: string): void {
  void enqueue(convId, async (s) => {
    const had = s.serverId != null;
    const id = await ensureCreated(convId, s);
    const c = find(convId);
    // A conversation created just now already has its title.
    if (id == null || !c || !had) return;
    await updateConversation(id, { title: c.title });
  });
}

function saveSettings(convId: string): void {
  const s = syncOf(convId);
  if (s.settingsQueued) return;
  s.settingsQueued = true;
  void enqueue(convId, async () => {
    s.settingsQueued = false;
    const had = s.serverId != null;
    const id = await ensureCreated(convId, s);
    const c = snapshot(convId);
    if (id == null || !c || !had) return;
    await updateConversation(id, { settings: storedSettings(c) });
  });
}

function stepRecord(m: ReplyStep, answered?: string): AssistantRecord {
  const st = m.stats;
  return {
    content: m.content,
    reasoning: m.reasoning || undefined,
    responseId: m.responseId,
    error: m.error,
    metadata: {
      client_finish: m.finish ?? 'error',
      client_ttft_ms: st?.ttftMs ?? undefined,
      client_tok_per_s: st?.tokPerS ?? undefined,
      client_usage_source: st && !st.live && st.source !== 'live' ? st.source : undefined,
      client_live_completion: st?.live ? st.completion : undefined,
      answered,
      tool_uses: m.tools?.length ? m.tools : undefined,
      turn: m.turn,
    },
  };
}

/**
 * Takes what the store recorded for a message: its id, and for a reply the
 * server's usage and finish of each step it holds (the step just written among
 * them); the reply is saved once the store holds all of its steps.
 */
function applyStored(m: Message, stored: Message): void {
  m.serverId = stored.serverId;
  if (m.role !== 'assistant') {
    m.saved = 'saved';
    return;
  }
  const shown = m.version ?? 0;
  const last = m.steps?.length ?? 0;
  const theirs = partsOf(stored);
  for (const t of theirs) {
    // The shown version's last step is the message itself.
    const p: ReplyStep | Message | undefined =
      t.version === shown
        ? t.step === last
          ? m
          : m.steps?.[t.step]
        : m.versions?.find((v) => v.version === t.version)?.steps[t.step];
    if (!p) continue;
    if (t.part.finish) p.finish = t.part.finish;
    if (t.part.stopSequence) p.stopSequence = t.part.stopSequence;
    if (t.part.stats && !t.part.stats.live) p.stats = t.part.stats;
    if (!p.responseId && t.part.responseId) p.responseId = t.part.responseId;
    if (!p.model && t.part.model) p.model = t.part.model;
  }
  m.storedParts = theirs.length;
  m.saved = theirs.length >= partsOf(m).length ? 'saved' : 'pending';
}

/** Writes the conversation's unsaved messages and reply steps in order, stopping at the step still streaming. */
function flush(convId: string): Promise<void> {
  return enqueue(convId, async (s) => {
    for (;;) {
      const c = find(convId);
      const m = c?.messages.find((x) => x.saved !== 'saved');
      if (!m) return;
      const streamingHere = state.streaming?.messageId === m.id;
      const key = m.id;
      try {
        const id = await ensureCreated(convId, s);
        if (id == null) return;
        const plain = JSON.parse(JSON.stringify(m)) as Message;
        let stored: Message;
        if (plain.role === 'user') {
          stored = await addUserMessage(id, plain.content, plain.images);
        } else {
          const parts = partsOf(plain);
          // The step still streaming is written when it ends; a step whose tool
          // calls wait for the user or run, once they are answered.
          let ready = streamingHere ? parts.length - 1 : parts.length;
          if (ready > 0 && unresolved(parts[ready - 1].part)) ready -= 1;
          const done = plain.serverId != null ? (plain.storedParts ?? 0) : 0;
          if (done >= ready) return;
          const next = parts[done];
          const record = stepRecord(next.part, next.answered);
          stored =
            plain.serverId == null
              ? await addAssistantMessage(id, record)
              : await addReplyPart(id, plain.serverId, { version: next.version, step: next.step }, record);
        }
        if (stored.serverId != null) s.messageIds.set(key, stored.serverId);
        patchMessage(convId, key, (x) => applyStored(x, stored));
      } catch (e) {
        // This one and every finished one after it wait for the next write.
        setState(
          'conversations',
          (x) => x.id === convId,
          'messages',
          (x) => x.saved !== 'saved' && state.streaming?.messageId !== x.id,
          'saved',
          'failed',
        );
        throw e;
      }
    }
  });
}

// ---- Loading ------------------------------------------------------------------

/** The store id a chat's address names: `/chat/ID`. */
export function chatIdInPath(path: string): number | null {
  const m = /^\/chat\/(\d+)\/?$/.exec(path);
  return m ? Number(m[1]) : null;
}

/** A chat's address, once the store has given it an id. */
export function chatPath(c: Conversation | undefined): string | null {
  return c?.serverId != null ? `/chat/${c.serverId}` : null;
}

/** Loads the stored conversations; chats started on this page meanwhile are kept. */
export async function loadConversations(): Promise<void> {
  try {
    const list = await listConversations();
    batch(() => {
      const known = new Set(state.conversations.map((c) => c.serverId));
      const fresh = list.filter((c) => !known.has(c.serverId) && !removed.has(c.serverId!));
      const merged = [...state.conversations, ...fresh];
      setState({ conversations: merged, loadError: null, loaded: true });
      // A link to a chat (`/chat/ID`, the store's id) opens that chat.
      const linked = chatIdInPath(location.pathname);
      const target = linked == null ? undefined : merged.find((c) => c.serverId === linked);
      if (target) setState({ currentId: target.id, missing: null });
      else if (linked != null && !state.currentId) {
        // A link to a chat that is gone says so; it never opens another chat in its place.
        setState('missing', linked);
      } else if (!state.currentId || !find(state.currentId)) setState('currentId', merged[0]?.id ?? null);
    });
  } catch (e) {
    setState({ loadError: `Cannot load your conversations: ${(e as Error).message}`, loaded: true });
  }
}

export async function initChat(): Promise<void> {
  if (initStarted) return;
  initStarted = true;
  await Promise.all([loadConversations(), loadModels()]);
}

export function dismissStoreError(): void {
  setState('storeError', null);
}

// ---- Actions --------------------------------------------------------------------

/**
 * The model a conversation will use: its own if the server has it (an alias
 * stands for the model it names), else the server's configured model.
 */
export function effectiveModel(c: Conversation | undefined): string {
  const ids = chatModels().map((m) => m.id);
  const own = c?.settings.model ? resolveModel(c.settings.model) : '';
  if (own && (ids.length === 0 || ids.includes(own))) return own;
  return defaultModelId() || own;
}

/**
 * A new chat's settings: the model of the chat the user was in (the model is
 * a choice that carries on), everything else the default preset's, or the
 * defaults. A chat's own system prompt, caps, stop sequences and sampling
 * stay with that chat.
 */
function freshSettings(prev: Conversation | undefined): ChatSettings {
  const base = defaultPresetSettings() ?? { ...DEFAULT_SETTINGS, stop: [...DEFAULT_SETTINGS.stop] };
  return { ...base, model: prev?.settings.model || defaultModelId() };
}

/**
 * Starts a chat at once; the store creates it in the background. An empty
 * chat already in the list (nothing sent yet) is reused and brought to the
 * top instead, so "+ New chat" never piles up empty ones.
 */
export function newChat(): Conversation {
  const prev = current();
  const empty = state.conversations.find((c) => c.messages.length === 0 && c.title === NEW_TITLE);
  if (empty) {
    batch(() => {
      // It starts as a new one would: the model of the chat left, the rest its defaults.
      if (prev && prev.id !== empty.id) {
        setState('conversations', (x) => x.id === empty.id, 'settings', freshSettings(prev));
      }
      setState('conversations', (list) => [list.find((c) => c.id === empty.id)!, ...list.filter((c) => c.id !== empty.id)]);
      setState('currentId', empty.id);
    });
    if (prev && prev.id !== empty.id) saveSettings(empty.id);
    return current()!;
  }
  const settings = freshSettings(prev);
  const now = Date.now();
  const c: Conversation = {
    id: newKey('new'),
    serverId: null,
    title: NEW_TITLE,
    created: now,
    updated: now,
    settings,
    messages: [],
  };
  batch(() => {
    setState('conversations', (list) => [c, ...list]);
    setState({ currentId: c.id, missing: null });
  });
  void enqueue(c.id, async (s) => void (await ensureCreated(c.id, s)));
  return c;
}

export function selectChat(id: string): void {
  setState({ currentId: id, missing: null });
}

/** Renames a chat (an empty name leaves it as it was); the store keeps the new title. */
export function renameChat(id: string, title: string): void {
  const t = title.trim().replace(/\s+/g, ' ').slice(0, TITLE_CHARS);
  if (!t || find(id)?.title === t) return;
  setState('conversations', (x) => x.id === id, 'title', t);
  saveTitle(id);
}

export function removeChat(id: string): void {
  if (state.streaming?.conversationId === id) stopReply();
  const s = syncOf(id); // takes the store id while the conversation is still on the page
  if (s.serverId != null) removed.add(s.serverId);
  batch(() => {
    const rest = state.conversations.filter((c) => c.id !== id);
    setState('conversations', rest);
    if (state.currentId === id) setState('currentId', rest[0]?.id ?? null);
  });
  void enqueue(id, async () => {
    if (s.serverId == null) return;
    removed.add(s.serverId);
    await deleteConversation(s.serverId);
  });
}

export function updateSettings(patch: Partial<ChatSettings>): void {
  const c = current() ?? newChat();
  setState('conversations', (x) => x.id === c.id, 'settings', (s) => ({ ...s, ...patch }));
  saveSettings(c.id);
}

export function stopReply(): void {
  controller?.abort();
}

function patchMessage(convId: string, msgId: string, fn: (m: Message) => void): void {
  setState(
    'conversations',
    (c) => c.id === convId,
    'messages',
    (m) => m.id === msgId,
    produce(fn),
  );
}

/** An empty reply about to stream from `model`, with live counts. */
function emptyReply(model: string): Message {
  return {
    id: newKey('m'),
    saved: 'pending',
    role: 'assistant',
    content: '',
    reasoning: '',
    model,
    created: Date.now(),
    stats: liveStats(),
  };
}

/** A step's counts before its first token: live, nothing yet. */
function liveStats(): Message['stats'] {
  return {
    prompt: null,
    cached: null,
    completion: 0,
    reasoning: null,
    total: null,
    live: true,
    source: 'live',
    ttftMs: null,
    tokPerS: null,
  };
}

/** A new chat's title until its model writes one: its first message's words. */
function firstWordsTitle(text: string): string {
  // The sidebar cuts it to its width; its tooltip shows it whole.
  return (text.trim() || 'Image').replace(/\s+/g, ' ').slice(0, TITLE_CHARS);
}

export async function sendMessage(text: string, images: ImageAttachment[] = []): Promise<void> {
  if (state.streaming || (text.trim() === '' && images.length === 0)) return;
  const conv = current() ?? newChat();
  const convId = conv.id;
  const model = effectiveModel(conv);
  const modelChanged = model !== conv.settings.model;
  if (modelChanged) setState('conversations', (x) => x.id === convId, 'settings', 'model', model);
  const first = conv.messages.length === 0;
  const user: Message = { id: newKey('m'), saved: 'pending', role: 'user', content: text, created: Date.now() };
  if (images.length) user.images = images;
  const reply = emptyReply(model);
  batch(() => {
    setState(
      'conversations',
      (x) => x.id === convId,
      produce((c) => {
        if (first) c.title = firstWordsTitle(text);
        c.messages.push(user, reply);
        c.updated = Date.now();
      }),
    );
    setState('streaming', { conversationId: convId, messageId: reply.id });
  });
  if (modelChanged) saveSettings(convId);
  if (first) saveTitle(convId);
  await replyWithTools(convId, reply.id);
  if (first) await writeTitle(convId, reply.id);
}

/**
 * After a chat's first reply, its model writes the chat's title in place of the
 * first message's words, unless the user renamed the chat meanwhile or turned
 * model titles off. The request is one of the ledger's like any other; the chat
 * keeps its id and cost beside the title.
 */
async function writeTitle(convId: string, replyId: string): Promise<void> {
  if (!modelTitles()) return;
  const c = find(convId);
  const [user, reply] = c?.messages ?? [];
  if (!c || !user || reply?.id !== replyId || !reply.content || (reply.finish !== 'stop' && reply.finish !== 'length')) return;
  const auto = c.title;
  const model = reply.model ?? effectiveModel(c);
  const got = await askTitle(model, [
    { role: 'user', content: user.content },
    { role: 'assistant', content: reply.content },
  ]);
  const now = find(convId);
  // Renamed (or gone) while the model wrote: the user's word stands.
  if (!got || !now || now.title !== auto) return;
  batch(() => {
    setState('conversations', (x) => x.id === convId, 'title', got.title);
    setState('conversations', (x) => x.id === convId, 'titleBy', got.info);
  });
  saveTitle(convId);
  saveSettings(convId);
}

/**
 * Whether `c`'s last message is a reply cut by its token limit, which
 * Continue can carry on (again after a step that was cut again), in its newest
 * version.
 */
export function canContinue(c: Conversation | undefined): boolean {
  const last = c?.messages[c.messages.length - 1];
  return last?.role === 'assistant' && last.finish === 'length' && last.content !== '' && showsNewest(last);
}

/**
 * Continues the last reply where its token limit cut it: the reply so far is
 * sent back as the start of the assistant's turn, and the model's next words
 * are appended to the same reply as a new step with usage of its own.
 */
export async function continueReply(): Promise<void> {
  const c = current();
  if (!c || state.streaming || !canContinue(c)) return;
  const convId = c.id;
  const reply = c.messages[c.messages.length - 1];
  const model = effectiveModel(c);
  batch(() => {
    patchMessage(convId, reply.id, (m) => {
      beginStep(m);
      m.model = model;
      m.stats = liveStats();
      m.saved = 'pending';
    });
    setState('conversations', (x) => x.id === convId, 'updated', Date.now());
    setState('streaming', { conversationId: convId, messageId: reply.id });
  });
  await replyWithTools(convId, reply.id);
}

/**
 * A new version of reply `idx` in place of the one shown, which is kept (with the
 * user's words it answered, `answered`, when they are being edited); what followed
 * the reply goes.
 */
async function newVersion(convId: string, idx: number, answered?: string): Promise<void> {
  const c = find(convId);
  const reply = c?.messages[idx];
  if (!c || !reply || reply.role !== 'assistant' || state.streaming) return;
  const model = effectiveModel(c);
  const after = c.messages[idx + 1];
  batch(() => {
    if (after) setState('conversations', (x) => x.id === convId, 'messages', (ms) => ms.slice(0, idx + 1));
    patchMessage(convId, reply.id, (m) => {
      beginVersion(m, answered);
      m.model = model;
      m.stats = liveStats();
      m.reasoning = '';
      m.saved = 'pending';
    });
    setState('conversations', (x) => x.id === convId, 'updated', Date.now());
    setState('streaming', { conversationId: convId, messageId: reply.id });
  });
  if (after) {
    void enqueue(convId, async (s) => {
      const mid = s.messageIds.get(after.id) ?? after.serverId;
      if (s.serverId != null && mid != null) await deleteMessagesFrom(s.serverId, mid);
    });
  }
  await replyWithTools(convId, reply.id);
}

/** A new version of the last reply to the same message; the one shown is kept beside it. */
export function regenerate(): Promise<void> {
  const c = current();
  const idx = c ? c.messages.length - 1 : -1;
  if (!c || c.messages[idx]?.role !== 'assistant') return Promise.resolve();
  return newVersion(c.id, idx);
}

/** Shows another version of a reply (‹ 1/2 ›). */
export function showVersion(msgId: string, version: number): void {
  const c = current();
  if (!c || state.streaming?.messageId === msgId) return;
  patchMessage(c.id, msgId, (m) => switchVersion(m, version));
}

/** The chat turn a reply's version is: every request of it (steps, tool-loop turns) says this one. */
function turnOf(convId: string, reply: Message): string {
  return `chat-${convId}/${reply.id}/v${reply.version ?? 0}`;
}

/** Streams the next step of reply `replyId`, the conversation's last message, from the messages before it. */
async function streamReply(convId: string, replyId: string): Promise<void> {
  void flush(convId);
  const live = snapshot(convId)!;
  const reply = live.messages[live.messages.length - 1];
  const history = live.messages.slice(0, -1);
  // A step after the first carries on from the reply so far, sent as the assistant's turn
  // (and, after a step that called tools, as those calls and their answers).
  if (reply.content !== '' || usedTools(reply)) history.push({ ...reply, finish: 'length' });
  controller = new AbortController();
  const tools = live.settings.tools ? await offeredTools() : [];
  const req = buildRequest(live.settings, history, tools.map((t) => t.tool));
  // Every step of this version serves one chat turn, the first step's.
  const turn = stepsOf(reply).find((st) => st.turn)?.turn ?? turnOf(convId, reply);
  patchMessage(convId, replyId, (m) => void (m.turn = turn));
  let result: StreamResult | null = null;
  try {
    result = await streamChat(req, controller.signal, {
      onText: (kind, piece) =>
        patchMessage(convId, replyId, (m) => {
          if (kind === 'content') m.content += piece;
          else m.reasoning = (m.reasoning ?? '') + piece;
        }),
      onStats: (stats) => patchMessage(convId, replyId, (m) => void (m.stats = stats)),
      onResponseId: (id) => patchMessage(convId, replyId, (m) => void (m.responseId = id)),
    }, turn);
  } finally {
    const r = result;
    batch(() => {
      patchMessage(convId, replyId, (m) => {
        if (!r) {
          m.finish = 'error';
          m.error = 'the reply could not be read';
          return;
        }
        m.finish = r.finish;
        m.stats = r.stats;
        if (r.stopSequence) m.stopSequence = r.stopSequence;
        if (r.error) m.error = r.error;
        if (r.responseId) m.responseId = r.responseId;
        if (r.toolCalls?.length && r.finish === 'tool_calls') {
          m.tools = r.toolCalls.map((c, i): ToolUse => {
            const known = tools.find((t) => t.function === c.function.name);
            return {
              id: c.id || `call_${i}`,
              name: c.function.name,
              arguments: c.function.arguments,
              state: 'asking',
              ...(known?.read_only ? { readOnly: true } : {}),
            };
          });
        }
      });
      controller = null;
      setState('streaming', null);
      setState('conversations', (x) => x.id === convId, 'updated', Date.now());
    });
    void flush(convId);
    // A model that was not in memory loaded for this reply.
    void loadModels();
  }
}

// ---- Tools (MCP) ----------------------------------------------------------------

/** The enabled MCP servers' tools; none (and the reply goes on without) when they cannot be listed. */
async function offeredTools(): Promise<McpTool[]> {
  try {
    const tools = await mcpTools();
    // The server's answers, and those given here it has not written yet.
    alwaysAllowed.clear();
    for (const t of tools) if (t.always_allow) alwaysAllowed.add(t.function);
    for (const f of answering) alwaysAllowed.add(f);
    return tools;
  } catch {
    return [];
  }
}

/**
 * Tools the user allowed for good ("Always"), by function name: the server keeps the
 * answers (each server's `alwaysAllow` in mcp.json), read with the tools each step offers;
 * an answer given here counts at once, before the server has written it.
 */
const alwaysAllowed = new Set<string>();
/** "Always" answers given here that the server is still writing. */
const answering = new Set<string>();

/** Forgets every "Always" answer, on the server; returns how many there were. */
export async function forgetAllowedTools(): Promise<number> {
  alwaysAllowed.clear();
  answering.clear();
  return (await forgetMcpAlwaysAllow()).forgotten;
}

/** The user's answers awaited, by call id. */
const waiting = new Map<string, (allowed: boolean) => void>();

/** The user's answer to a tool call waiting in the shown chat. */
export function answerTool(callId: string, answer: 'once' | 'always' | 'deny'): void {
  const resolve = waiting.get(callId);
  if (!resolve) return;
  if (answer === 'always') {
    const c = current();
    const use = c?.messages.flatMap((m) => m.tools ?? []).find((t) => t.id === callId);
    if (use) {
      alwaysAllowed.add(use.name);
      answering.add(use.name);
      void setMcpAlwaysAllow(use.name, true)
        .catch((e) => console.warn('the server did not keep the answer', e))
        .finally(() => answering.delete(use.name));
    }
  }
  waiting.delete(callId);
  resolve(answer !== 'deny');
}

const unresolved = (p: ReplyStep) => p.tools?.some((t) => t.state === 'asking' || t.state === 'running') ?? false;

function patchTool(convId: string, replyId: string, callId: string, fn: (t: ToolUse) => void): void {
  patchMessage(convId, replyId, (m) => {
    const t = m.tools?.find((x) => x.id === callId);
    if (t) fn(t);
  });
}

/**
 * Streams a reply, then, while its last step called tools: asks the user about
 * each call (unless allowed already), runs the allowed ones, and streams the next
 * step with their answers, until the model answers without a call, the chat's
 * step limit is reached, or Stop. Each step is a request of its own (its own
 * usage, its own ledger row); the tools' time is kept apart from the model's.
 */
async function replyWithTools(convId: string, replyId: string): Promise<void> {
  await streamReply(convId, replyId);
  for (;;) {
    const c = find(convId);
    const m = c?.messages.find((x) => x.id === replyId);
    if (!c || !m || m.finish !== 'tool_calls' || !m.tools?.length) return;
    const limit = Math.max(1, c.settings.toolSteps);
    // The last turn the limit allows: its calls would go back to no one.
    if (stepsOf(m).length >= limit) {
      batch(() => {
        patchMessage(convId, replyId, (x) => {
          for (const t of x.tools ?? []) t.state = 'skipped';
          x.toolLimit = limit;
        });
        setState('streaming', null);
      });
      void flush(convId);
      return;
    }
    const ctl = new AbortController();
    controller = ctl;
    setState('streaming', { conversationId: convId, messageId: replyId });
    for (const t of m.tools) {
      if (ctl.signal.aborted) break;
      const auto = (c.settings.autoReadOnly && t.readOnly === true) || alwaysAllowed.has(t.name);
      let allowed = auto;
      if (!auto) {
        allowed = await new Promise<boolean>((resolve) => {
          waiting.set(t.id, resolve);
          ctl.signal.addEventListener('abort', () => {
            waiting.delete(t.id);
            resolve(false);
          });
        });
        if (ctl.signal.aborted) break;
      }
      if (!allowed) {
        patchTool(convId, replyId, t.id, (x) => void (x.state = 'denied'));
        continue;
      }
      patchTool(convId, replyId, t.id, (x) => {
        x.state = 'running';
        if (auto) x.auto = true;
      });
      const t0 = performance.now();
      try {
        const out = await callMcpTool(t.name, t.arguments, ctl.signal);
        patchTool(convId, replyId, t.id, (x) => {
          x.state = 'done';
          x.result = out.content;
          x.isError = out.is_error;
          x.truncated = out.truncated;
          x.tookMs = out.took_ms;
        });
      } catch (e) {
        patchTool(convId, replyId, t.id, (x) => {
          x.state = ctl.signal.aborted ? 'skipped' : 'failed';
          // The server's words, without the HTTP status the page's errors lead with.
          x.result = e instanceof ApiError ? e.detail : (e as Error).message;
          x.tookMs = Math.round(performance.now() - t0);
        });
      }
    }
    const stop = ctl.signal.aborted;
    batch(() => {
      patchMessage(convId, replyId, (x) => {
        for (const t of x.tools ?? []) if (t.state === 'asking' || t.state === 'running') t.state = 'skipped';
        if (!stop) {
          beginStep(x);
          x.model = effectiveModel(c);
          x.stats = liveStats();
          x.saved = 'pending';
        }
      });
      controller = null;
      if (stop) setState('streaming', null);
      setState('conversations', (x) => x.id === convId, 'updated', Date.now());
    });
    if (stop) {
      void flush(convId);
      return;
    }
    await streamReply(convId, replyId);
  }
}

/**
 * Drops the conversation's messages from `idx` on, here and in the store, and
 * sends `text` as the user's message in their place.
 */
function resendFrom(idx: number, text: string): void {
  const c = current();
  if (!c || state.streaming || idx < 0 || idx >= c.messages.length || text.trim() === '') return;
  const convId = c.id;
  const from = c.messages[idx];
  const key = from.id;
  setState('conversations', (x) => x.id === convId, 'messages', (ms) => ms.slice(0, idx));
  void enqueue(convId, async (s) => {
    const mid = s.messageIds.get(key) ?? from.serverId;
    if (s.serverId != null && mid != null) await deleteMessagesFrom(s.serverId, mid);
  });
  void sendMessage(text);
}

/** Sends the last user message again: a new reply in place of the last one (after an error, a cancel, or to regenerate). */
export function retryLast(): void {
  const c = current();
  if (!c) return;
  const idx = c.messages.map((m) => m.role).lastIndexOf('user');
  if (idx >= 0) resendFrom(idx, c.messages[idx].content);
}

/**
 * Replaces a sent user message with `text` and sends it again. The reply to it
 * gets a new version (the old one is kept, remembering the words it answered);
 * what followed that reply goes. A message with no reply that answered it (a
 * failed or cancelled one) is simply sent again in its place.
 */
export function editMessage(msgId: string, text: string): void {
  const c = current();
  const idx = c?.messages.findIndex((m) => m.id === msgId) ?? -1;
  if (!c || idx < 0 || c.messages[idx].role !== 'user' || state.streaming || text.trim() === '') return;
  const reply = c.messages[idx + 1];
  const answered = reply?.role === 'assistant' && reply.content !== '' && reply.finish !== 'error';
  if (!answered) {
    resendFrom(idx, text);
    return;
  }
  const convId = c.id;
  const user = c.messages[idx];
  const old = user.content;
  if (old !== text) {
    setState('conversations', (x) => x.id === convId, 'messages', (m) => m.id === user.id, 'content', text);
    // Written before the new version, so the store marks only the old ones with the old words.
    void enqueue(convId, async (s) => {
      const mid = s.messageIds.get(user.id) ?? user.serverId;
      if (s.serverId != null && mid != null) await editUserMessage(s.serverId, mid, text);
    });
  }
  // A title the chat got from its first message (its words, or the model's title
  // of them) follows that message's edit; one the user gave stays.
  const retitle = idx === 0 && old !== text && (c.titleBy != null || c.title === firstWordsTitle(old));
  if (retitle) {
    batch(() => {
      setState('conversations', (x) => x.id === convId, 'title', firstWordsTitle(text));
      setState('conversations', (x) => x.id === convId, 'titleBy', undefined);
    });
    saveTitle(convId);
    saveSettings(convId);
  }
  void newVersion(convId, idx + 1, old !== text ? old : undefined).then(() => (retitle ? writeTitle(convId, reply.id) : undefined));
}
