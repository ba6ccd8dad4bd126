// Conversations and their per-chat settings. The only module that knows where
// they live (the browser's localStorage for now); everything else goes through
// the async functions below, so moving to a server-side store swaps this file.
import type { Finish } from './finish';

export interface ChatSettings {
  model: string;
  systemPrompt: string;
  /** Empty: the server's default. */
  temperature: number | null;
  /** Empty: the server's default. */
  maxTokens: number | null;
  stop: string[];
  reasoning: boolean;
}

export interface ReplyStats {
  prompt: number | null;
  cached: number | null;
  completion: number;
  reasoning: number | null;
  total: number | null;
  /** True while the counts are live (deltas seen so far), false once the server's usage arrived. */
  live: boolean;
  /** Where the final numbers came from. */
  source: 'stream' | 'ledger' | 'live';
  ttftMs: number | null;
  tokPerS: number | null;
}

export interface Message {
  id: string;
  role: 'user' | 'assistant';
  content: string;
  reasoning?: string;
  /** Assistant replies only. */
  responseId?: string;
  model?: string;
  finish?: Finish;
  error?: string;
  stats?: ReplyStats;
}

export interface Conversation {
  id: string;
  title: string;
  created: number;
  updated: number;
  settings: ChatSettings;
  messages: Message[];
}

export const DEFAULT_SETTINGS: ChatSettings = {
  model: '',
  systemPrompt: '',
  temperature: null,
  maxTokens: null,
  stop: [],
  reasoning: false,
};

const KEY = 'shoal.conversations.v1';

function readAll(): Conversation[] {
  try {
    const raw = localStorage.getItem(KEY);
    const list = raw ? (JSON.parse(raw) as Conversation[]) : [];
    return Array.isArray(list) ? list.map(normalize) : [];
  } catch {
    return [];
  }
}

function writeAll(list: Conversation[]): void {
  try {
    localStorage.setItem(KEY, JSON.stringify(list));
  } catch (e) {
    console.warn('could not save conversations', e);
  }
}

function normalize(c: Conversation): Conversation {
  return {
    ...c,
    settings: { ...DEFAULT_SETTINGS, ...(c.settings ?? {}) },
    messages: Array.isArray(c.messages) ? c.messages : [],
  };
}

export function newId(prefix: string): string {
  const r = crypto.getRandomValues(new Uint32Array(2));
  return `${prefix}${Date.now().toString(36)}${r[0].toString(36)}${r[1].toString(36)}`;
}

/** All conversations, most recently updated first. */
export async function listConversations(): Promise<Conversation[]> {
  return readAll().sort((a, b) => b.updated - a.updated);
}

export async function saveConversation(c: Conversation): Promise<void> {
  const list = readAll().filter((x) => x.id !== c.id);
  list.push(c);
  writeAll(list);
}

export async function deleteConversation(id: string): Promise<void> {
  writeAll(readAll().filter((x) => x.id !== id));
}

export function createConversation(settings: Partial<ChatSettings> = {}): Conversation {
  const now = Date.now();
  return {
    id: newId('c_'),
    title: 'New chat',
    created: now,
    updated: now,
    settings: { ...DEFAULT_SETTINGS, ...settings },
    messages: [],
  };
}
