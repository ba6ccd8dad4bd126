// One streamed chat completion: POST /v1/chat/completions with stream: true,
// read as SSE, turned into deltas, live counts and a final result.
import { apiError, ledgerEntry, type LedgerEntry, type Usage } from './api';
import { apiFetch } from './auth';
import { finishFromApi, type Finish } from './finish';
import { canReason } from './models';
import { readSse } from './sse';
import { stepsOf } from './reply';
import { draftStats, type ChatSettings, type Message, type ReplyStats, type ToolUse } from './store';

/** A tool call as a chat request carries it back in the assistant's turn. */
export interface WireToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

/** A user turn's content with images: OpenAI's typed parts. */
export type WirePart = { type: 'text'; text: string } | { type: 'image_url'; image_url: { url: string } };

export type WireMessage =
  | { role: 'system'; content: string }
  | { role: 'user'; content: string | WirePart[] }
  | { role: 'assistant'; content: string | null; tool_calls?: WireToolCall[] }
  | { role: 'tool'; tool_call_id: string; content: string };

export interface ChatRequest {
  model: string;
  messages: WireMessage[];
  tools?: unknown[];
  tool_choice?: 'auto' | 'required';
  stream: true;
  stream_options: { include_usage: true };
  temperature?: number;
  top_p?: number;
  top_k?: number;
  min_p?: number;
  repetition_penalty?: number;
  seed?: number;
  max_tokens?: number;
  stop?: string[];
  reasoning_effort?: 'low';
}

/** A sampling setting a chat can override: the request field it is sent as and the values the form lets through. */
export interface SamplingField {
  key: 'temperature' | 'topP' | 'topK' | 'minP' | 'repetitionPenalty' | 'seed';
  wire: 'temperature' | 'top_p' | 'top_k' | 'min_p' | 'repetition_penalty' | 'seed';
  label: string;
  /** What it does, for its tooltip. */
  hint: string;
  min: number;
  max: number;
  /** `min` itself is refused. */
  aboveMin?: boolean;
  integer?: boolean;
  step: string;
  /** The value that turns it off, named beside the model's default. */
  off?: number;
}

/** The ranges the server takes (shoal-engine's `SamplingParams::validate`; the repetition penalty's cap as its Ollama dialect checks). */
export const SAMPLING: SamplingField[] = [
  {
    key: 'temperature', wire: 'temperature', label: 'Temperature', min: 0, max: 2, step: '0.1',
    hint: 'How random the reply is: 0 always takes the likeliest token',
  },
  {
    key: 'topP', wire: 'top_p', label: 'Top P', min: 0, max: 1, aboveMin: true, step: '0.05', off: 1,
    hint: 'Samples from the likeliest tokens that together make up this share of the probability',
  },
  {
    key: 'topK', wire: 'top_k', label: 'Top K', min: 0, max: Infinity, integer: true, step: '1', off: 0,
    hint: 'Samples from this many of the likeliest tokens only',
  },
  {
    key: 'minP', wire: 'min_p', label: 'Min P', min: 0, max: 1, step: '0.05', off: 0,
    hint: 'Leaves out tokens less likely than this share of the likeliest one',
  },
  {
    key: 'repetitionPenalty', wire: 'repetition_penalty', label: 'Repetition penalty', min: 0, max: 100, aboveMin: true, step: '0.05', off: 1,
    hint: 'Makes tokens seen in the last 64 tokens less likely (above 1) or more likely (below 1)',
  },
  // Past 2^53 a JavaScript number is no longer the whole number typed.
  {
    key: 'seed', wire: 'seed', label: 'Seed', min: 0, max: Number.MAX_SAFE_INTEGER, integer: true, step: '1',
    hint: 'The same seed and settings give the same reply again',
  },
];

/** Why `v` cannot be sent as `f`; null when it can (or is empty: the model's default). */
export function samplingProblem(f: SamplingField, v: number | null): string | null {
  if (v == null) return null;
  const whole = f.integer ? 'a whole number of ' : '';
  const range = `${f.aboveMin ? 'more than' : 'at least'} ${f.min}${Number.isFinite(f.max) ? ` and at most ${f.max}` : ''}`;
  if ((f.integer && !Number.isInteger(v)) || v < f.min || (f.aboveMin && v === f.min) || v > f.max) {
    return `${f.label} must be ${whole}${range}, not ${v}`;
  }
  return null;
}

/** What the model reads back for a tool call, whatever became of it. */
export function toolReply(t: ToolUse): string {
  switch (t.state) {
    case 'done':
      return t.result ?? '';
    case 'denied':
      return 'The user did not allow this tool call.';
    case 'failed':
      return `The tool could not run: ${t.result ?? 'unknown error'}`;
    default:
      return 'The tool was not run: the reply was stopped first.';
  }
}

/** Whether a reply holds a step that called tools. */
export const usedTools = (m: Message) => stepsOf(m).some((s) => s.tools?.length);

/**
 * A reply as the turns a chat request carries: its steps' text as one assistant
 * turn, broken where a step called tools by that call and each tool's answer.
 */
function replyTurns(m: Message, out: WireMessage[]): void {
  for (const step of stepsOf(m)) {
    const prev = out[out.length - 1];
    if (step.tools?.length) {
      const calls = step.tools.map((t) => ({ id: t.id, type: 'function' as const, function: { name: t.name, arguments: t.arguments } }));
      if (prev?.role === 'assistant' && !prev.tool_calls) {
        prev.content = (prev.content ?? '') + step.content;
        prev.tool_calls = calls;
      } else {
        out.push({ role: 'assistant', content: step.content || null, tool_calls: calls });
      }
      for (const t of step.tools) out.push({ role: 'tool', tool_call_id: t.id, content: toolReply(t) });
    } else if (step.content !== '') {
      // A reply continued after its token limit is one turn: its steps joined.
      if (prev?.role === 'assistant' && !prev.tool_calls) prev.content = (prev.content ?? '') + step.content;
      else out.push({ role: 'assistant', content: step.content });
    }
  }
}

/** A user message as a chat turn: its text, with its images as parts before it. */
function userContent(m: Message): string | WirePart[] {
  if (!m.images?.length) return m.content;
  const parts: WirePart[] = m.images.map((i) => ({
    type: 'image_url',
    image_url: { url: `data:${i.mediaType};base64,${i.data}` },
  }));
  parts.push({ type: 'text', text: m.content });
  return parts;
}

export function buildRequest(settings: ChatSettings, history: Message[], tools?: unknown[]): ChatRequest {
  const messages: WireMessage[] = [];
  if (settings.systemPrompt.trim()) messages.push({ role: 'system', content: settings.systemPrompt });
  for (const m of history) {
    // Failed replies carry no model text; they are not part of the conversation.
    if (m.role === 'assistant' && (m.finish === 'error' || (m.content === '' && !usedTools(m)))) continue;
    if (m.role === 'assistant') replyTurns(m, messages);
    else messages.push({ role: 'user', content: userContent(m) });
  }
  const req: ChatRequest = {
    model: settings.model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
  };
  for (const f of SAMPLING) {
    const v = settings[f.key];
    if (v != null) req[f.wire] = v;
  }
  if (settings.maxTokens != null) req.max_tokens = settings.maxTokens;
  const stop = settings.stop.filter((s) => s !== '');
  if (stop.length) req.stop = stop;
  // Never asked of a model the server says cannot reason.
  if (settings.reasoning && canReason(settings.model) !== false) req.reasoning_effort = 'low';
  if (tools?.length) {
    req.tools = tools;
    req.tool_choice = settings.toolChoice;
  }
  return req;
}

export interface StreamHandlers {
  onText(kind: 'content' | 'reasoning', text: string): void;
  onStats(stats: ReplyStats): void;
  onResponseId(id: string): void;
}

export interface StreamResult {
  finish: Finish;
  /** The stop sequence that matched (finish `stop_sequence`), from the server's ledger. */
  stopSequence?: string;
  error?: string;
  responseId?: string;
  stats: ReplyStats;
  /** The tools the model called, in order. */
  toolCalls?: WireToolCall[];
}

function usageStats(u: Usage, ttftMs: number | null, spanMs: number | null, source: ReplyStats['source']): ReplyStats {
  const completion = u.completion_tokens ?? 0;
  return {
    prompt: u.prompt_tokens ?? null,
    cached: u.prompt_tokens_details?.cached_tokens ?? 0,
    cachedDisk: u.prompt_tokens_details?.cached_disk_tokens ?? 0,
    image: u.prompt_tokens_details?.image_tokens ?? 0,
    completion,
    reasoning: u.completion_tokens_details?.reasoning_tokens ?? 0,
    total: u.total_tokens ?? null,
    live: false,
    source,
    ttftMs,
    tokPerS: spanMs && spanMs > 0 && completion > 0 ? completion / (spanMs / 1000) : null,
  };
}

/** Puts the server's TTFT and decode speed for a finished reply into `stats`. */
function serverTimings(stats: ReplyStats, entry: LedgerEntry): void {
  if (typeof entry.ttft_ms === 'number') stats.ttftMs = entry.ttft_ms;
  if (typeof entry.decode_tokens_per_s === 'number' && entry.decode_tokens_per_s > 0) {
    stats.tokPerS = entry.decode_tokens_per_s;
  }
  stats.drafts = draftStats(entry.draft_tokens, entry.draft_accepted);
}

/**
 * Runs one request to its end; never throws (errors become an "error" result). `turn` names
 * the chat turn it serves (`x-shoal-turn`): the ledger ties a reply's requests together by it
 * (each model turn of a tool loop, each step of a continued reply).
 */
export async function streamChat(req: ChatRequest, signal: AbortSignal, h: StreamHandlers, turn?: string): Promise<StreamResult> {
  const t0 = performance.now();
  let first: number | null = null;
  let last: number | null = null;
  let deltas = 0;
  let text = '';
  let responseId: string | undefined;
  let finishReason: string | null = null;
  let usage: Usage | null = null;
  let sawDone = false;
  const calls: WireToolCall[] = [];

  const ttft = () => (first == null ? null : first - t0);
  const span = () => (first == null || last == null ? null : last - first);
  const liveStats = (): ReplyStats => {
    const s = span();
    return {
      prompt: null,
      cached: null,
      completion: deltas,
      reasoning: null,
      total: null,
      live: true,
      source: 'live',
      ttftMs: ttft(),
      tokPerS: s && s > 0 ? deltas / (s / 1000) : null,
    };
  };
  const fail = (message: string): StreamResult => ({
    finish: 'error',
    error: message,
    responseId,
    stats: usage ? usageStats(usage, ttft(), span(), 'stream') : liveStats(),
  });

  let res: Response;
  try {
    res = await apiFetch('/v1/chat/completions', {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'text/event-stream', ...(turn ? { 'x-shoal-turn': turn } : {}) },
      body: JSON.stringify(req),
      signal,
    });
  } catch (e) {
    if (signal.aborted) return { finish: 'cancelled', stats: liveStats() };
    return fail(`cannot reach the server (${(e as Error).message})`);
  }
  if (!res.ok) return fail((await apiError(res)).message);
  if (!res.body) return fail('the server sent no body');

  try {
    for await (const ev of readSse(res.body)) {
      if (ev.data === '[DONE]') {
        sawDone = true;
        break;
      }
      let chunk: any;
      try {
        chunk = JSON.parse(ev.data);
      } catch {
        continue;
      }
      if (ev.event === 'error' || chunk?.error) {
        const m = chunk?.error?.message ?? chunk?.message ?? ev.data;
        return fail(String(m));
      }
      if (!responseId && typeof chunk.id === 'string') {
        responseId = chunk.id;
        h.onResponseId(chunk.id);
      }
      if (chunk.usage) usage = chunk.usage as Usage;
      const choice = Array.isArray(chunk.choices) ? chunk.choices[0] : undefined;
      if (choice) {
        const d = choice.delta ?? {};
        for (const kind of ['reasoning', 'content'] as const) {
          const piece = kind === 'content' ? d.content : d.reasoning_content;
          if (typeof piece === 'string' && piece !== '') {
            const now = performance.now();
            if (first == null) first = now;
            last = now;
            deltas += 1;
            if (kind === 'content') text += piece;
            h.onText(kind, piece);
          }
        }
        // A tool call arrives in pieces: its id and name first, then its arguments' text.
        for (const tc of Array.isArray(d.tool_calls) ? d.tool_calls : []) {
          const i = typeof tc.index === 'number' ? tc.index : calls.length;
          calls[i] ??= { id: '', type: 'function', function: { name: '', arguments: '' } };
          if (typeof tc.id === 'string') calls[i].id = tc.id;
          if (typeof tc.function?.name === 'string') calls[i].function.name += tc.function.name;
          if (typeof tc.function?.arguments === 'string') {
            calls[i].function.arguments += tc.function.arguments;
            const now = performance.now();
            if (first == null) first = now;
            last = now;
            deltas += 1;
          }
        }
        if (choice.finish_reason) finishReason = choice.finish_reason;
      }
      h.onStats(usage ? usageStats(usage, ttft(), span(), 'stream') : liveStats());
    }
  } catch (e) {
    if (signal.aborted) return cancelled();
    return fail(`the stream broke off (${(e as Error).message})`);
  }
  if (signal.aborted && !finishReason) return cancelled();
  if (!finishReason && !sawDone) return fail('the stream ended before the reply finished');

  const stats = usage ? usageStats(usage, ttft(), span(), 'stream') : liveStats();
  let finish = finishFromApi(finishReason);
  let stopSequence: string | undefined;
  // Once the reply has ended, its time to first token and decode speed are
  // the server's (as the Usage view shows them), not what the browser timed
  // through the network.
  const entry = responseId ? await ledgerEntry(responseId) : null;
  if (entry) serverTimings(stats, entry);
  // The OpenAI dialect says "stop" for both an end of turn and a matched stop
  // sequence; the server's ledger keeps the engine's own reason.
  if (finish === 'stop' && req.stop?.length) {
    if (entry?.engine_finish_reasons?.[0] === 'stop_sequence') {
      finish = 'stop_sequence';
      stopSequence = entry.stop_sequences?.[0] ?? undefined;
    }
  }
  const toolCalls = calls.filter((c) => c && c.function.name);
  return { finish, stopSequence, responseId, stats, ...(toolCalls.length ? { toolCalls } : {}) };

  // The server records what a cancelled request used in its ledger; show
  // those exact numbers rather than the live count when they arrive.
  async function cancelled(): Promise<StreamResult> {
    const live = liveStats();
    if (responseId) {
      const entry = await ledgerEntry(responseId);
      if (entry?.usage && typeof (entry.usage as any).completion_tokens === 'number') {
        const stats = usageStats(entry.usage as unknown as Usage, ttft(), span(), 'ledger');
        serverTimings(stats, entry);
        return { finish: 'cancelled', responseId, stats };
      }
    }
    return { finish: 'cancelled', responseId, stats: live };
  }
}
