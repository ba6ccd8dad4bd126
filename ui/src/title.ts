// A chat's title written by its own model after the first reply: a short request
// of its own (the first exchange, then the ask), recorded in the usage ledger
// like any other request; the chat keeps what it cost beside the title. Off by
// a switch kept in this browser, for people whose model is slow.
import { createSignal } from 'solid-js';
import { completeChat } from './api';

/** What writing a chat's title cost, as the server reported it. */
export interface TitleInfo {
  responseId: string;
  model: string;
  promptTokens: number;
  completionTokens: number;
}

const KEY = 'shoal.modelTitles';
const ASK =
  'Write a title of at most six words for the conversation so far. Reply with the title only: no quotes, no full stop.';
/** A title is a few words; the cap keeps a rambling model short. */
const MAX_TOKENS = 16;
const MAX_CHARS = 60;

const [on, setOn] = createSignal(localStorage.getItem(KEY) !== 'off');
export { on as modelTitles };

export function setModelTitles(v: boolean): void {
  localStorage.setItem(KEY, v ? 'on' : 'off');
  setOn(v);
}

/** What a model wrote, made a title: its first line, without quotes, a "Title:" label or an end stop; empty if nothing is left. */
export function cleanTitle(raw: string): string {
  const line = raw.replace(/<think>[\s\S]*?<\/think>/g, '').trim().split('\n')[0] ?? '';
  let t = line
    .replace(/^\s*(title|chat title)\s*:\s*/i, '')
    .replace(/^[#*"'“”‘’`\s]+|["'“”‘’`*\s]+$/g, '')
    .replace(/[.。!]+$/, '')
    .replace(/\s+/g, ' ')
    .trim();
  if (t.length > MAX_CHARS) t = `${t.slice(0, MAX_CHARS - 1).trimEnd()}…`;
  return t;
}

/** A typed `TitleInfo` from what a store kept, or undefined. */
export function toTitleInfo(raw: unknown): TitleInfo | undefined {
  const r = raw && typeof raw === 'object' ? (raw as Record<string, unknown>) : null;
  if (!r || typeof r.responseId !== 'string' || typeof r.model !== 'string') return undefined;
  const n = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) ? v : 0);
  return { responseId: r.responseId, model: r.model, promptTokens: n(r.promptTokens), completionTokens: n(r.completionTokens) };
}

/**
 * Asks `model` for a title of the exchange; null when it could not (an error, or
 * nothing usable came back). Greedy, so the same chat gets the same title.
 */
export async function askTitle(
  model: string,
  exchange: { role: 'user' | 'assistant'; content: string }[],
): Promise<{ title: string; info: TitleInfo } | null> {
  try {
    const v = await completeChat({
      model,
      messages: [...exchange, { role: 'user', content: ASK }],
      max_tokens: MAX_TOKENS,
      temperature: 0,
    });
    const title = cleanTitle(v.choices?.[0]?.message?.content ?? '');
    if (!title || typeof v.id !== 'string') return null;
    return {
      title,
      info: {
        responseId: v.id,
        model: v.model ?? model,
        promptTokens: v.usage?.prompt_tokens ?? 0,
        completionTokens: v.usage?.completion_tokens ?? 0,
      },
    };
  } catch {
    return null;
  }
}
