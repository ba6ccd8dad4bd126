// One message of a chat as shown: its text (a reply rendered as Markdown), usage, finish and
// actions (copy, edit and resend, regenerate, retry, Continue). Apart from Chat.tsx because it is
// the per-message rendering, independent of the page around it (sidebar, toolbar, composer).
import { createEffect, createSignal, For, onCleanup, Show } from 'solid-js';
import { answerTool, continueReply, editMessage, regenerate, retryLast, showVersion } from '../../chatState';
import { FinishBadge } from '../../components/FinishBadge';
import { summary, UsageStats } from '../../components/UsageStats';
import { FINISH } from '../../finish';
import { renderMarkdown } from '../../markdown';
import { fmtDateTime, fmtInt } from '../../format';
import { allVersions, stepsOf } from '../../reply';
import { copyText } from '../../share';
import type { ImageAttachment, Message, ToolUse } from '../../store';

const imageSrc = (i: ImageAttachment) => `data:${i.mediaType};base64,${i.data}`;

/** A user message's images as thumbnails; one clicked opens large until clicked again or Esc. */
function MessageImages(props: { images: ImageAttachment[] }) {
  const [open, setOpen] = createSignal<ImageAttachment | null>(null);
  const close = (e: KeyboardEvent) => {
    if (e.key === 'Escape') setOpen(null);
  };
  createEffect(() => {
    if (open()) document.addEventListener('keydown', close);
    else document.removeEventListener('keydown', close);
  });
  onCleanup(() => document.removeEventListener('keydown', close));
  return (
    <>
      <div class="msg-images" data-testid="message-images">
        <For each={props.images}>
          {(img) => (
            <button
              type="button"
              class="thumb"
              data-testid="image-thumb"
              title={img.name ? `${img.name} (click to enlarge)` : 'Click to enlarge'}
              onClick={() => setOpen(img)}
            >
              <img src={imageSrc(img)} alt={img.name ?? 'image'} />
            </button>
          )}
        </For>
      </div>
      <Show when={open()}>
        {(img) => (
          <div class="lightbox" data-testid="image-lightbox" role="dialog" aria-label="Image" onClick={() => setOpen(null)}>
            <img src={imageSrc(img())} alt={img().name ?? 'image'} />
          </div>
        )}
      </Show>
    </>
  );
}

/** A button that copies `text()` and says so for a moment. */
function CopyButton(props: { text: () => string; testid: string; label?: string }) {
  const [done, setDone] = createSignal<'copied' | 'failed' | null>(null);
  return (
    <button
      class="btn small ghost"
      type="button"
      data-testid={props.testid}
      data-copied={done() ?? ''}
      onClick={async () => {
        setDone((await copyText(props.text())) ? 'copied' : 'failed');
        setTimeout(() => setDone(null), 1500);
      }}
    >
      {done() === 'copied' ? 'Copied' : done() === 'failed' ? 'Copy failed' : (props.label ?? 'Copy')}
    </button>
  );
}

/**
 * A reply's text as HTML, each code block with a Copy button of its own (added
 * to the rendered blocks, since the sanitiser lets no button through).
 */
function Markdown(props: { text: string; live: boolean }) {
  let box!: HTMLDivElement;
  createEffect(() => {
    box.innerHTML = renderMarkdown(props.text, { live: props.live });
    for (const pre of box.querySelectorAll('pre')) {
      const wrap = document.createElement('div');
      wrap.className = 'code-block';
      const b = document.createElement('button');
      b.type = 'button';
      b.className = 'btn small code-copy';
      b.dataset.testid = 'copy-code';
      b.textContent = 'Copy';
      pre.replaceWith(wrap);
      wrap.append(b, pre);
    }
  });
  const onClick = async (e: MouseEvent) => {
    const b = (e.target as HTMLElement).closest<HTMLButtonElement>('[data-testid=copy-code]');
    const code = b?.parentElement?.querySelector('pre code');
    if (!b || !code) return;
    // The rendered block ends with the newline marked puts before `</code>`.
    const ok = await copyText((code.textContent ?? '').replace(/\n$/, ''));
    b.textContent = ok ? 'Copied' : 'Copy failed';
    b.dataset.copied = ok ? 'copied' : 'failed';
    setTimeout(() => {
      b.textContent = 'Copy';
      b.dataset.copied = '';
    }, 1500);
  };
  return <div class="md" data-testid="assistant-content" ref={box} onClick={(e) => void onClick(e)} />;
}
export function MessageView(props: {
  msg: Message;
  /** The reply before this one, when this one continues it. */
  continues: boolean;
  last: boolean;
  streaming: boolean;
  busy: boolean;
  blocked: string | null;
}) {
  const m = () => props.msg;
  const [editing, setEditing] = createSignal<string | null>(null);
  return (
    <Show
      when={m().role === 'assistant'}
      fallback={
        <div class="msg user" data-testid="message-user" data-saved={m().saved} title={when(m().created)} data-created={m().created ?? ''}>
          <Show
            when={editing() != null}
            fallback={
              <>
                <Show when={m().images?.length}>
                  <MessageImages images={m().images!} />
                </Show>
                <Show when={m().content}>
                  <div class="bubble" data-testid="user-content">
                    {m().content}
                  </div>
                </Show>
                <div class="msg-actions">
                  <CopyButton text={() => m().content} testid="copy-message" />
                  <button
                    class="btn small ghost"
                    type="button"
                    data-testid="edit-message"
                    disabled={props.busy}
                    title="Change this message and send it again; the reply to it keeps its earlier versions, the messages after it go"
                    onClick={() => setEditing(m().content)}
                  >
                    Edit
                  </button>
                </div>
              </>
            }
          >
            <form
              class="edit-form"
              onSubmit={(e) => {
                e.preventDefault();
                const text = editing() ?? '';
                if (!text.trim() || props.busy || props.blocked) return;
                setEditing(null);
                editMessage(m().id, text);
              }}
            >
              <textarea
                data-testid="edit-input"
                rows={3}
                value={editing() ?? ''}
                onInput={(e) => setEditing(e.currentTarget.value)}
                onKeyDown={(e) => {
                  // As in the composer: Enter sends, Shift+Enter adds a line.
                  if (e.key === 'Escape') setEditing(null);
                  else if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
                    e.preventDefault();
                    e.currentTarget.form?.requestSubmit();
                  }
                }}
              />
              <div class="msg-actions">
                <button class="btn small" type="button" data-testid="edit-cancel" onClick={() => setEditing(null)}>
                  Cancel
                </button>
                <button
                  class="btn small primary"
                  type="submit"
                  data-testid="edit-send"
                  disabled={!editing()?.trim() || props.busy || !!props.blocked}
                  title={props.blocked ?? ''}
                >
                  Send
                </button>
              </div>
            </form>
          </Show>
          <Show when={m().saved === 'failed'}>
            <NotSaved />
          </Show>
        </div>
      }
    >
      <div
        class="msg assistant"
        classList={{ continued: props.continues }}
        data-testid="message-assistant"
        title={when(m().created)}
        data-created={m().created ?? ''}
        data-continues={props.continues ? 'true' : 'false'}
        data-streaming={props.streaming ? 'true' : 'false'}
        data-response-id={m().responseId ?? ''}
        data-saved={m().saved}
      >
        <Show when={m().reasoning}>
          <details class="reasoning" data-testid="reasoning-block" open={props.streaming && !m().content}>
            <summary>
              Reasoning
              <Show when={m().stats?.reasoning != null && !m().stats?.live}>
                {' '}
                <span class="muted">({m().stats!.reasoning} tokens)</span>
              </Show>
            </summary>
            <div class="reasoning-text" data-testid="reasoning-content">
              {m().reasoning}
            </div>
          </details>
        </Show>
        <Show when={m().answered}>
          <div class="answered muted" data-testid="answered" title={m().answered}>
            An answer to an earlier wording: “{m().answered}”
          </div>
        </Show>
        <div class="bubble">
          <Show when={m().content || !props.streaming} fallback={<span class="typing" data-testid="waiting">…</span>}>
            <Markdown text={m().content} live={props.streaming} />
            <Show when={!m().content && !m().error && !stepsOf(m()).some((st) => st.tools?.length)}>
              <span class="muted" data-testid="no-answer">
                {m().reasoning ? '(no answer after the reasoning)' : '(no text)'}
              </span>
            </Show>
          </Show>
          <Show when={stepsOf(m()).some((st) => st.tools?.length)}>
            <ToolUses msg={m()} />
          </Show>
          <Show when={m().toolLimit}>
            <div class="tool-limit muted" data-testid="tool-limit">
              Stopped at this chat's limit of {m().toolLimit} model turns: the last turn's calls were not run.
            </div>
          </Show>
          <Show when={m().error}>
            <div class="error-text" role="alert" data-testid="error-message">
              {m().error}
            </div>
          </Show>
        </div>
        <div class="msg-foot">
          <Show when={(m().versions?.length ?? 0) > 0}>
            <Versions msg={m()} locked={props.streaming} />
          </Show>
          <Show when={props.continues}>
            <span class="tag" data-testid="continued" title="This step carries on the reply above after its token limit; its usage is its own">
              continued
            </span>
          </Show>
          <Show when={m().finish}>
            <FinishBadge finish={m().finish!} stopSequence={m().stopSequence} />
          </Show>
          <Show when={m().stats && !(m().finish === 'error' && m().stats!.completion === 0)}>
            <UsageStats stats={m().stats!} />
          </Show>
          <Show when={(m().steps?.length ?? 0) > 0}>
            <Steps msg={m()} />
          </Show>
          <Show when={!props.streaming}>
            <span class="msg-actions">
              <Show when={m().content}>
                <CopyButton text={() => m().content} testid="copy-message" />
              </Show>
              <Show
                when={m().finish === 'error' || m().finish === 'cancelled'}
                fallback={
                  <Show when={props.last}>
                    <button
                      class="btn small ghost"
                      data-testid="regenerate"
                      disabled={props.busy || !!props.blocked}
                      title={props.blocked ?? 'A new reply to the same message; this one is kept as an earlier version'}
                      onClick={() => void regenerate()}
                    >
                      Regenerate
                    </button>
                  </Show>
                }
              >
                <button class="btn small" data-testid="retry" disabled={!!props.blocked} title={props.blocked ?? ''} onClick={retryLast}>
                  Retry
                </button>
              </Show>
              <Show when={props.last && m().finish === 'length' && m().content}>
                <button
                  class="btn small"
                  data-testid="continue"
                  disabled={props.busy || !!props.blocked}
                  title={props.blocked ?? 'Carry on the reply from where the token limit cut it'}
                  onClick={() => void continueReply()}
                >
                  Continue
                </button>
              </Show>
            </span>
          </Show>
          <Show when={m().saved === 'failed'}>
            <NotSaved />
          </Show>
        </div>
      </div>
    </Show>
  );
}

/** ‹ 2/3 ›: which version of a reply is shown, and the way to the others. */
function Versions(props: { msg: Message; locked: boolean }) {
  const all = () => allVersions(props.msg).map((v) => v.version);
  const at = () => all().indexOf(props.msg.version ?? 0);
  const go = (d: number) => {
    const n = all()[at() + d];
    if (n != null) showVersion(props.msg.id, n);
  };
  const arrow = (d: -1 | 1) => (
    <button
      class="btn small ghost"
      type="button"
      data-testid={d < 0 ? 'version-prev' : 'version-next'}
      aria-label={d < 0 ? 'Earlier version' : 'Later version'}
      disabled={props.locked || all()[at() + d] == null}
      onClick={() => go(d)}
    >
      {d < 0 ? '‹' : '›'}
    </button>
  );
  return (
    <span class="versions" data-testid="versions">
      {arrow(-1)}
      <span data-testid="version-label">
        {at() + 1}/{all().length}
      </span>
      {arrow(1)}
    </span>
  );
}

/**
 * A continued reply's steps, each with the finish and exact usage of its own
 * request (plain text here: the reply's own badge and stats line are the last step's).
 */
function Steps(props: { msg: Message }) {
  const steps = () => stepsOf(props.msg);
  const tokens = () => steps().reduce((n, s) => n + (s.stats?.completion ?? 0), 0);
  const toolMs = () => steps().reduce((n, s) => n + (s.tools ?? []).reduce((k, t) => k + (t.tookMs ?? 0), 0), 0);
  const toolCount = () => steps().reduce((n, s) => n + (s.tools ?? []).filter((t) => t.tookMs != null).length, 0);
  return (
    <details class="steps" data-testid="reply-steps">
      <summary>
        {steps().length} steps · {fmtInt(tokens())} tokens in all
        <Show when={toolCount() > 0}>
          <span data-testid="tool-time">
            {' · '}
            {toolCount()} tool {toolCount() === 1 ? 'call' : 'calls'}, {(toolMs() / 1000).toFixed(2)} s in tools
          </span>
        </Show>
        <Show when={props.msg.turn}>
          {' · '}
          <a href={`/usage?turn=${encodeURIComponent(props.msg.turn!)}`} data-testid="turn-ledger" title="This reply's requests in the usage ledger">
            ledger rows
          </a>
        </Show>
      </summary>
      <ol>
        <For each={steps()}>
          {(s) => (
            <li
              data-testid="reply-step"
              data-response-id={s.responseId ?? ''}
              data-finish={s.finish ?? ''}
              data-prompt={s.stats?.prompt ?? ''}
              data-completion={s.stats?.completion ?? ''}
            >
              {s.finish ? FINISH[s.finish].label : '…'}
              <Show when={s.stats}>
                {' · '}
                {summary(s.stats!)}
                <Show when={s.stats!.prompt != null}> · prompt {fmtInt(s.stats!.prompt!)}</Show>
              </Show>
            </li>
          )}
        </For>
      </ol>
    </details>
  );
}

const TOOL_STATE: Record<ToolUse['state'], string> = {
  asking: 'waiting for you',
  running: 'running…',
  done: 'done',
  denied: 'denied',
  failed: 'failed',
  skipped: 'not run',
};

/**
 * The tools a reply's steps called: each call's name and arguments, Allow /
 * Always / Deny while it waits, then its result (folded) and its own time.
 */
function ToolUses(props: { msg: Message }) {
  const uses = () => stepsOf(props.msg).flatMap((s) => s.tools ?? []);
  return (
    <div class="tool-uses" data-testid="tool-uses">
      <For each={uses()}>
        {(t) => (
          <div class="tool-use" data-testid="tool-use" data-tool={t.name} data-state={t.state}>
            <div class="tool-head">
              <span class="tool-name">{t.name}</span>
              <span class="tag" data-testid="tool-state">
                {TOOL_STATE[t.state]}
                {t.auto ? ' (allowed ahead)' : ''}
              </span>
              <Show when={t.readOnly}>
                <span class="tag" title="Its server says it changes nothing (a hint, not a guarantee)">read-only</span>
              </Show>
              <Show when={t.tookMs != null}>
                <span class="muted" data-testid="tool-took">{(t.tookMs! / 1000).toFixed(2)} s</span>
              </Show>
            </div>
            <pre class="tool-args" data-testid="tool-args">{t.arguments || '{}'}</pre>
            <Show when={t.state === 'asking'}>
              <div class="tool-ask" role="group" aria-label={`Run ${t.name}?`}>
                <button class="btn small" data-testid="tool-allow" onClick={() => answerTool(t.id, 'once')}>
                  Allow once
                </button>
                <button class="btn small ghost" data-testid="tool-always" onClick={() => answerTool(t.id, 'always')}>
                  Always allow {t.name}
                </button>
                <button class="btn small ghost" data-testid="tool-deny" onClick={() => answerTool(t.id, 'deny')}>
                  Deny
                </button>
              </div>
            </Show>
            <Show when={t.result != null}>
              <details class="tool-result" data-testid="tool-result">
                <summary>
                  {t.state === 'failed' ? 'Error' : t.isError ? 'Result (the tool reports an error)' : 'Result'}
                  <Show when={t.truncated}> · cut to the server's limit</Show>
                </summary>
                <pre data-testid="tool-result-text">{t.result}</pre>
              </details>
            </Show>
          </div>
        )}
      </For>
    </div>
  );
}

function NotSaved() {
  return (
    <span
      class="tag warn"
      data-testid="not-saved"
      title="The conversation store did not take this message yet; it is written again with the next one. Reloading the page now loses it."
    >
      not saved
    </span>
  );
}

/** A message's time as its hover shows it ("Dec 6, 14:05:09"); nothing for a message with none. */
function when(ms: number | undefined): string | undefined {
  return ms ? fmtDateTime(ms / 1000) : undefined;
}
