// The chat's state, kept outside the view so a reply keeps streaming into its
// conversation while another tab is shown.
import { batch } from 'solid-js';
import { createStore, produce } from 'solid-js/store';
import { listModels, type ModelInfo } from './api';
import { buildRequest, streamChat } from './chat';
import {
  createConversation,
  deleteConversation,
  listConversations,
  newId,
  saveConversation,
  type ChatSettings,
  type Conversation,
  type Message,
} from './store';

interface ChatState {
  loaded: boolean;
  conversations: Conversation[];
  currentId: string | null;
  models: ModelInfo[];
  modelsError: string | null;
  /** The reply being streamed, if any (one at a time). */
  streaming: { conversationId: string; messageId: string } | null;
}

const [state, setState] = createStore<ChatState>({
  loaded: false,
  conversations: [],
  currentId: null,
  models: [],
  modelsError: null,
  streaming: null,
});

export { state as chat };

let controller: AbortController | null = null;
let initStarted = false;

export function current(): Conversation | undefined {
  return state.conversations.find((c) => c.id === state.currentId);
}

function snapshot(id: string): Conversation | undefined {
  const c = state.conversations.find((x) => x.id === id);
  return c ? (JSON.parse(JSON.stringify(c)) as Conversation) : undefined;
}

function persist(id: string): void {
  const c = snapshot(id);
  if (c) void saveConversation(c);
}

export async function loadModels(): Promise<void> {
  try {
    const models = await listModels();
    setState({ models, modelsError: models.length ? null : 'The server has no model loaded.' });
  } catch (e) {
    setState({ modelsError: `Cannot load the model list: ${(e as Error).message}` });
  }
}

export async function initChat(): Promise<void> {
  if (initStarted) return;
  initStarted = true;
  const list = await listConversations();
  batch(() => {
    setState({ conversations: list, currentId: list[0]?.id ?? null, loaded: true });
  });
  await loadModels();
}

/** The model a conversation will use: its own if the server has it, else the first one. */
export function effectiveModel(c: Conversation | undefined): string {
  const ids = state.models.map((m) => m.id);
  if (c?.settings.model && (ids.length === 0 || ids.includes(c.settings.model))) return c.settings.model;
  return ids[0] ?? c?.settings.model ?? '';
}

export function newChat(): Conversation {
  const prev = current();
  // A new chat starts from the previous chat's settings (model, prompt, sampling).
  const c = createConversation(prev ? { ...prev.settings } : { model: state.models[0]?.id ?? '' });
  setState('conversations', (list) => [c, ...list]);
  setState('currentId', c.id);
  persist(c.id);
  return c;
}

export function selectChat(id: string): void {
  setState('currentId', id);
}

export function removeChat(id: string): void {
  if (state.streaming?.conversationId === id) stopReply();
  batch(() => {
    const rest = state.conversations.filter((c) => c.id !== id);
    setState('conversations', rest);
    if (state.currentId === id) setState('currentId', rest[0]?.id ?? null);
  });
  void deleteConversation(id);
}

export function updateSettings(patch: Partial<ChatSettings>): void {
  const c = current() ?? newChat();
  setState('conversations', (x) => x.id === c.id, 'settings', (s) => ({ ...s, ...patch }));
  persist(c.id);
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

export async function sendMessage(text: string): Promise<void> {
  if (state.streaming || text.trim() === '') return;
  const conv = current() ?? newChat();
  const model = effectiveModel(conv);
  if (model !== conv.settings.model) {
    setState('conversations', (x) => x.id === conv.id, 'settings', 'model', model);
  }
  const user: Message = { id: newId('m_'), role: 'user', content: text };
  const reply: Message = {
    id: newId('m_'),
    role: 'assistant',
    content: '',
    reasoning: '',
    model,
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
  const convId = conv.id;
  setState(
    'conversations',
    (x) => x.id === convId,
    produce((c) => {
      if (c.messages.length === 0) c.title = text.trim().replace(/\s+/g, ' ').slice(0, 48);
      c.messages.push(user, reply);
      c.updated = Date.now();
    }),
  );
  persist(convId);

  const live = snapshot(convId)!;
  const req = buildRequest(live.settings, live.messages.slice(0, -1));
  controller = new AbortController();
  setState('streaming', { conversationId: convId, messageId: reply.id });
  try {
    const result = await streamChat(req, controller.signal, {
      onText: (kind, piece) =>
        patchMessage(convId, reply.id, (m) => {
          if (kind === 'content') m.content += piece;
          else m.reasoning = (m.reasoning ?? '') + piece;
        }),
      onStats: (stats) => patchMessage(convId, reply.id, (m) => void (m.stats = stats)),
      onResponseId: (id) => patchMessage(convId, reply.id, (m) => void (m.responseId = id)),
    });
    patchMessage(convId, reply.id, (m) => {
      m.finish = result.finish;
      m.stats = result.stats;
      if (result.error) m.error = result.error;
      if (result.responseId) m.responseId = result.responseId;
    });
  } finally {
    controller = null;
    setState('streaming', null);
    setState('conversations', (x) => x.id === convId, 'updated', Date.now());
    persist(convId);
  }
}

/** Sends the last user message again (after an error or a cancel). */
export function retryLast(): void {
  const c = current();
  if (!c || state.streaming) return;
  const lastUser = [...c.messages].reverse().find((m) => m.role === 'user');
  if (!lastUser) return;
  const idx = c.messages.lastIndexOf(lastUser);
  // Drop the last exchange and send it again.
  setState('conversations', (x) => x.id === c.id, 'messages', (ms) => ms.slice(0, idx));
  void sendMessage(lastUser.content);
}
