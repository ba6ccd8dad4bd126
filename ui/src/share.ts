// What leaves the page: a chat as a file (Markdown to read, JSON to process;
// each reply with the usage and finish reason the server reported for it, per
// step when a reply was continued, never the live estimate) and copied text.
import type { Conversation, Message, ReplyStats } from './store';

/** A reply's usage in the OpenAI dialect's words, or null while it is only a live count. */
function usageOf(st: ReplyStats | undefined) {
  if (!st || st.live) return null;
  return {
    prompt_tokens: st.prompt,
    cached_tokens: st.cached,
    completion_tokens: st.completion,
    reasoning_tokens: st.reasoning,
    total_tokens: st.total,
    source: st.source,
    ...(st.drafts ? { draft_tokens: st.drafts.checked, draft_accepted: st.drafts.kept } : {}),
  };
}

/** Whether `msgs[i]` continues the reply before it (a step after a token limit). */
export function isContinuation(msgs: readonly Message[], i: number): boolean {
  return i > 0 && msgs[i].role === 'assistant' && msgs[i - 1].role === 'assistant';
}

export function chatJson(c: Conversation): string {
  return JSON.stringify(
    {
      title: c.title,
      id: c.serverId,
      created: new Date(c.created).toISOString(),
      settings: c.settings,
      messages: c.messages.map((m, i) =>
        m.role === 'user'
          ? { role: 'user', content: m.content }
          : {
              role: 'assistant',
              content: m.content,
              ...(m.reasoning ? { reasoning: m.reasoning } : {}),
              continues_previous: isContinuation(c.messages, i),
              model: m.model ?? null,
              response_id: m.responseId ?? null,
              finish_reason: m.finish ?? null,
              ...(m.stopSequence ? { stop_sequence: m.stopSequence } : {}),
              ...(m.error ? { error: m.error } : {}),
              usage: usageOf(m.stats),
            },
      ),
    },
    null,
    2,
  );
}

/** One line under a reply: its finish and exact token counts. */
function replyLine(m: Message): string {
  const u = usageOf(m.stats);
  const parts = [`finish: ${m.finish ?? 'unknown'}`];
  if (m.model) parts.unshift(`model: ${m.model}`);
  if (u) {
    parts.push(`prompt ${u.prompt_tokens ?? '?'} tokens (${u.cached_tokens ?? 0} cached)`);
    parts.push(`completion ${u.completion_tokens} tokens${u.reasoning_tokens ? ` (${u.reasoning_tokens} reasoning)` : ''}`);
  }
  return `_${parts.join(' · ')}_`;
}

export function chatMarkdown(c: Conversation): string {
  const out = [`# ${c.title}`, ''];
  if (c.settings.systemPrompt.trim()) out.push('**System**', '', c.settings.systemPrompt, '');
  c.messages.forEach((m, i) => {
    if (m.role === 'user') out.push('**User**', '', m.content, '');
    else {
      out.push(isContinuation(c.messages, i) ? '**Assistant** (continued)' : '**Assistant**', '');
      if (m.reasoning) out.push('<details><summary>Reasoning</summary>', '', m.reasoning, '', '</details>', '');
      if (m.content) out.push(m.content, '');
      if (m.error) out.push(`> Error: ${m.error}`, '');
      out.push(replyLine(m), '');
    }
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
