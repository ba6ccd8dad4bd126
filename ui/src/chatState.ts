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
import { buildRequest, streamChat, type StreamResult } from './chat';
import {
  addAssistantMessage,
  addUserMessage,
  createConversation,
  DEFAULT_SETTINGS,
  deleteConversation,
  deleteMessagesFrom,
  listConversations,
  NEW_TITLE,
  updateConversation,
  type AssistantRecord,
  type ChatSettings,
  type Conversation,
  type Message,
} from './store';
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
  const made = await createConversation(c.title, c.settings);
  s.serverId = made.serverId;
  setState('conversations', (x) => x.id === convId, 'serverId', made.serverId);
  return s.serverId;
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
    await updateConversation(id, { settings: c.settings });
  });
}

function assistantRecord(m: Message): AssistantRecord {
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
    },
  };
}

/** Takes what the store recorded for a message: its id, and for a reply the server's usage and finish. */
function applyStored(m: Message, stored: Message): void {
  m.serverId = stored.serverId;
  m.saved = 'saved';
  if (m.role !== 'assistant') return;
  if (stored.finish) m.finish = stored.finish;
  if (stored.stopSequence) m.stopSequence = stored.stopSequence;
  if (stored.stats && !stored.stats.live) m.stats = stored.stats;
  if (!m.responseId && stored.responseId) m.responseId = stored.responseId;
  if (!m.model && stored.model) m.model = stored.model;
}

/** Writes the conversation's unsaved messages in order, stopping at the reply still streaming. */
function flush(convId: string): Promise<void> {
  return enqueue(convId, async (s) => {
    for (;;) {
      const c = find(convId);
      const m = c?.messages.find((x) => x.saved !== 'saved');
      if (!m || state.streaming?.messageId === m.id) return;
      const key = m.id;
      try {
        const id = await ensureCreated(convId, s);
        if (id == null) return;
        const plain = JSON.parse(JSON.stringify(m)) as Message;
        const stored =
          plain.role === 'user' ? await addUserMessage(id, plain.content) : await addAssistantMessage(id, assistantRecord(plain));
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
    stats: {
      prompt: null,
      cached: null,
      completion: 0,
      reasoning: null,
      total: null,
      live: true,
      source: 'live',
      ttftMs: null,
      tokPerS: null,
    },
  };
}

export async function sendMessage(text: string): Promise<void> {
  if (state.streaming || text.trim() === '') return;
  const conv = current() ?? newChat();
  const convId = conv.id;
  const model = effectiveModel(conv);
  const modelChanged = model !== conv.settings.model;
  if (modelChanged) setState('conversations', (x) => x.id === convId, 'settings', 'model', model);
  const first = conv.messages.length === 0;
  const user: Message = { id: newKey('m'), saved: 'pending', role: 'user', content: text, created: Date.now() };
  const reply = emptyReply(model);
  batch(() => {
    setState(
      'conversations',
      (x) => x.id === convId,
      produce((c) => {
        // The sidebar cuts it to its width; its tooltip shows it whole.
        if (first) c.title = text.trim().replace(/\s+/g, ' ').slice(0, TITLE_CHARS);
        c.messages.push(user, reply);
        c.updated = Date.now();
      }),
    );
    setState('streaming', { conversationId: convId, messageId: reply.id });
  });
  if (modelChanged) saveSettings(convId);
  if (first) saveTitle(convId);
  await streamReply(convId, reply);
}

/**
 * Whether `c`'s last message is a reply cut by its token limit, which
 * Continue can carry on (a continuation is itself such a reply when it is cut
 * again).
 */
export function canContinue(c: Conversation | undefined): boolean {
  const last = c?.messages[c.messages.length - 1];
  return last?.role === 'assistant' && last.finish === 'length' && last.content !== '';
}

/**
 * Continues the last reply where its token limit cut it: the reply so far is
 * sent back as the start of the assistant's turn and the model's next words
 * stream into a new step of the same reply, with usage of its own.
 */
export async function continueReply(): Promise<void> {
  const c = current();
  if (!c || state.streaming || !canContinue(c)) return;
  const convId = c.id;
  const reply = emptyReply(effectiveModel(c));
  batch(() => {
    setState(
      'conversations',
      (x) => x.id === convId,
      produce((x) => {
        x.messages.push(reply);
        x.updated = Date.now();
      }),
    );
    setState('streaming', { conversationId: convId, messageId: reply.id });
  });
  await streamReply(convId, reply);
}

/** Streams `reply`, the conversation's last message, from the messages before it. */
async function streamReply(convId: string, reply: Message): Promise<void> {
  void flush(convId);
  const live = snapshot(convId)!;
  const req = buildRequest(live.settings, live.messages.slice(0, -1));
  controller = new AbortController();
  let result: StreamResult | null = null;
  try {
    result = await streamChat(req, controller.signal, {
      onText: (kind, piece) =>
        patchMessage(convId, reply.id, (m) => {
          if (kind === 'content') m.content += piece;
          else m.reasoning = (m.reasoning ?? '') + piece;
        }),
      onStats: (stats) => patchMessage(convId, reply.id, (m) => void (m.stats = stats)),
      onResponseId: (id) => patchMessage(convId, reply.id, (m) => void (m.responseId = id)),
    });
  } finally {
    const r = result;
    batch(() => {
      patchMessage(convId, reply.id, (m) => {
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

/** Replaces a sent user message with `text` and sends it again; what followed it goes. */
export function editMessage(msgId: string, text: string): void {
  const c = current();
  const idx = c?.messages.findIndex((m) => m.id === msgId) ?? -1;
  if (c && idx >= 0 && c.messages[idx].role === 'user') resendFrom(idx, text);
}
