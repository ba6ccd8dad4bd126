// What leaves the page: a chat as a file (Markdown to read, JSON to process;
// each reply with the usage and finish reason the server reported for it, per
// step when a reply was continued and per version when it was regenerated,
// never the live estimate) and copied text.
import { allVersions, stepsOf } from './reply';
import { imageRecord } from './store';
import type { Conversation, ImageAttachment, Message, ReplyStats, ReplyStep, ReplyVersion } from './store';

/** A reply's usage in the OpenAI dialect's words, or null while it is only a live count. */
function usageOf(st: ReplyStats | undefined) {
  if (!st || st.live) return null;
  return {
    prompt_tokens: st.prompt,
    cached_tokens: st.cached,
    completion_tokens: st.completion,
    reasoning_tokens: st.reasoning,
    total_tokens: st.total,
    ...(st.image ? { image_tokens: st.image } : {}),
    source: st.source,
    ...(st.drafts ? { draft_tokens: st.drafts.checked, draft_accepted: st.drafts.kept } : {}),
  };
}

/** Whether `msgs[i]` continues the reply before it (a step after a token limit). */
export function isContinuation(msgs: readonly Message[], i: number): boolean {
  return i > 0 && msgs[i].role === 'assistant' && msgs[i - 1].role === 'assistant';
}

/** The sum of steps' usage: every token the reply's requests used; null while one is only a live count. */
function summedUsage(steps: readonly ReplyStep[]) {
  const all = steps.map((x) => usageOf(x.stats));
  if (all.some((u) => u == null)) return null;
  const add = (k: 'prompt_tokens' | 'cached_tokens' | 'completion_tokens' | 'reasoning_tokens' | 'total_tokens') =>
    all.some((u) => u![k] == null) ? null : all.reduce((n, u) => n + (u![k] ?? 0), 0);
  const image = all.reduce((n, u) => n + (u!.image_tokens ?? 0), 0);
  return {
    prompt_tokens: add('prompt_tokens'),
    cached_tokens: add('cached_tokens'),
    completion_tokens: add('completion_tokens'),
    reasoning_tokens: add('reasoning_tokens'),
    total_tokens: add('total_tokens'),
    ...(image ? { image_tokens: image } : {}),
  };
}

function stepJson(x: ReplyStep) {
  return {
    content: x.content,
    response_id: x.responseId ?? null,
    finish_reason: x.finish ?? null,
    ...(x.stopSequence ? { stop_sequence: x.stopSequence } : {}),
    ...(x.error ? { error: x.error } : {}),
    usage: usageOf(x.stats),
  };
}

/** A version of a reply: its text, and per step (a continued reply has several) what the server reported. */
function versionJson(v: ReplyVersion) {
  const last = v.steps[v.steps.length - 1];
  return {
    version: v.version,
    ...(v.answered !== undefined ? { answered: v.answered } : {}),
    content: v.steps.map((x) => x.content).join(''),
    finish_reason: last?.finish ?? null,
    usage: v.steps.length > 1 ? summedUsage(v.steps) : usageOf(last?.stats),
    ...(v.steps.length > 1 ? { steps: v.steps.map(stepJson) } : {}),
  };
}

/** An image as Markdown: inline as a `data:` URL, so the file needs nothing beside it. */
function imageMarkdown(i: ImageAttachment, k: number): string {
  const alt = (i.name ?? `image ${k + 1}`).replace(/[[\]\\]/g, '');
  return `![${alt}](data:${i.mediaType};base64,${i.data})`;
}

export function chatJson(c: Conversation): string {
  return JSON.stringify(
    {
      title: c.title,
      id: c.serverId,
      created: new Date(c.created).toISOString(),
      settings: c.settings,
      messages: c.messages.map((m, i) => {
        if (m.role === 'user') return { role: 'user', content: m.content, ...(m.images?.length ? { images: m.images.map(imageRecord) } : {}) };
        const steps = stepsOf(m);
        const others = allVersions(m).filter((v) => v.version !== (m.version ?? 0));
        return {
          role: 'assistant',
          content: m.content,
          ...(m.reasoning ? { reasoning: m.reasoning } : {}),
          continues_previous: isContinuation(c.messages, i),
          model: m.model ?? null,
          response_id: m.responseId ?? null,
          finish_reason: m.finish ?? null,
          ...(m.stopSequence ? { stop_sequence: m.stopSequence } : {}),
          ...(m.error ? { error: m.error } : {}),
          // A continued reply: every token its steps' requests used, and each step's own.
          usage: steps.length > 1 ? summedUsage(steps) : usageOf(m.stats),
          ...(steps.length > 1 ? { steps: steps.map(stepJson) } : {}),
          ...(m.answered !== undefined ? { answered: m.answered } : {}),
          ...(others.length ? { version: m.version ?? 0, other_versions: others.map(versionJson) } : {}),
        };
      }),
    },
    null,
    2,
  );
}

/** One line under a reply or one of its steps: its finish and exact token counts. */
function replyLine(m: ReplyStep, label = ''): string {
  const u = usageOf(m.stats);
  const parts = [`finish: ${m.finish ?? 'unknown'}`];
  if (m.model) parts.unshift(`model: ${m.model}`);
  if (label) parts.unshift(label);
  if (u) {
    const image = u.image_tokens ? `, ${u.image_tokens} image` : '';
    parts.push(`prompt ${u.prompt_tokens ?? '?'} tokens (${u.cached_tokens ?? 0} cached${image})`);
    parts.push(`completion ${u.completion_tokens} tokens${u.reasoning_tokens ? ` (${u.reasoning_tokens} reasoning)` : ''}`);
  }
  return `_${parts.join(' · ')}_`;
}

/** A version's text and a line per step. */
function versionMarkdown(steps: readonly ReplyStep[], reasoning: string | undefined, error: string | undefined): string[] {
  const out: string[] = [];
  if (reasoning) out.push('<details><summary>Reasoning</summary>', '', reasoning, '', '</details>', '');
  const text = steps.map((x) => x.content).join('');
  if (text) out.push(text, '');
  if (error) out.push(`> Error: ${error}`, '');
  steps.forEach((x, i) => out.push(replyLine(x, steps.length > 1 ? `step ${i + 1} of ${steps.length}` : ''), ''));
  return out;
}

export function chatMarkdown(c: Conversation): string {
  const out = [`# ${c.title}`, ''];
  if (c.settings.systemPrompt.trim()) out.push('**System**', '', c.settings.systemPrompt, '');
  c.messages.forEach((m, i) => {
    if (m.role === 'user') {
      out.push('**User**', '', m.content, '');
      m.images?.forEach((img, k) => out.push(imageMarkdown(img, k), ''));
      return;
    }
    const all = allVersions(m);
    const at = all.findIndex((v) => v.version === (m.version ?? 0));
    const which = all.length > 1 ? ` (version ${at + 1} of ${all.length})` : '';
    out.push(isContinuation(c.messages, i) ? '**Assistant** (continued)' : `**Assistant**${which}`, '');
    if (m.answered) out.push(`> An answer to an earlier wording: ${m.answered}`, '');
    out.push(...versionMarkdown(stepsOf(m), m.reasoning, m.error));
    all.forEach((v, k) => {
      if (k === at) return;
      out.push(`<details><summary>Version ${k + 1} of ${all.length}</summary>`, '');
      if (v.answered) out.push(`> An answer to an earlier wording: ${v.answered}`, '');
      const last = v.steps[v.steps.length - 1];
      out.push(...versionMarkdown(v.steps, last?.reasoning, last?.error), '</details>', '');
    });
  });
  return out.join('\n');
}

/** A file name from the chat's title. */
export function fileName(c: Conversation, ext: string): string {
  const base = c.title.replace(/[^\p{L}\p{N}]+/gu, '-').replace(/^-|-$/g, '').slice(0, 60) || 'chat';
  return `${base}.${ext}`;
}

/** Saves `text` as a download named `name`. */
export function download(name: string, type: string, text: string): void {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 0);
}

/** Puts `text` on the clipboard; false when the browser refuses. */
export async function copyText(text: string): Promise<boolean> {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    return false;
  }
}
