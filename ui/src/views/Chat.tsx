import { createEffect, createSignal, For, on, onCleanup, onMount, Show, untrack } from 'solid-js';
import {
  chat,
  current,
  chatIdInPath,
  chatPath,
  continueReply,
  dismissStoreError,
  editMessage,
  effectiveModel,
  initChat,
  loadConversations,
  loadModels,
  newChat,
  removeChat,
  retryLast,
  selectChat,
  sendMessage,
  stopReply,
  updateSettings,
} from '../chatState';
import { ErrorBanner } from '../components/ErrorBanner';
import { FinishBadge } from '../components/FinishBadge';
import { modelLabel, ModelsPanel } from '../components/ModelsPanel';
import { UsageStats } from '../components/UsageStats';
import { ServerSettings } from '../components/ServerSettings';
import { renderMarkdown } from '../markdown';
import { chatJson, chatMarkdown, copyText, download, fileName, isContinuation } from '../share';
import { fmtBytes } from '../format';
import { canReason, chatModels, lib, modelById } from '../models';
import { SAMPLING, samplingProblem, type SamplingField } from '../chat';
import type { ModelInfo } from '../api';
import type { Conversation, Message } from '../store';

/** Settings fields whose text is not a number, by field (the chat's settings hold null for them meanwhile). */
const [unreadable, setUnreadable] = createSignal<Record<string, string>>({});

/** Why a chat's settings cannot be sent as they are (checked before sending); null when they can. */
function settingsProblem(c: Conversation | undefined, model: ModelInfo | undefined): string | null {
  if (!c) return null;
  return (
    Object.values(unreadable())[0] ??
    maxTokensProblem(c.settings.maxTokens, model?.shoal?.context_length) ??
    SAMPLING.map((f) => samplingProblem(f, c.settings[f.key])).find((p) => p != null) ??
    null
  );
}

export function ChatView() {
  const [draft, setDraft] = createSignal('');
  const [settingsOpen, setSettingsOpen] = createSignal(false);
  const [modelsOpen, setModelsOpen] = createSignal(false);
  const [sidebarOpen, setSidebarOpen] = createSignal(false);
  let input!: HTMLTextAreaElement;
  let scroller!: HTMLDivElement;

  onMount(() => {
    void initChat();
    input.focus();
  });

  const onKey = (e: KeyboardEvent) => {
    if (e.key === 'Escape' && chat.streaming) {
      e.preventDefault();
      stopReply();
    }
  };
  document.addEventListener('keydown', onKey);
  onCleanup(() => document.removeEventListener('keydown', onKey));

  const send = () => {
    const text = draft();
    if (!text.trim() || chat.streaming || problem()) return;
    setDraft('');
    void sendMessage(text);
  };

  // Follow the reply as it grows, unless the reader scrolled up.
  let pinned = true;
  const onScroll = () => {
    pinned = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 80;
  };
  createEffect(() => {
    const c = current();
    const last = c?.messages[c.messages.length - 1];
    void (last?.content.length, last?.reasoning?.length, last?.finish, c?.id);
    if (pinned) queueMicrotask(() => (scroller.scrollTop = scroller.scrollHeight));
  });
  createEffect(on(() => chat.currentId, () => (pinned = true)));

  const chosen = () => modelById(effectiveModel(current()));
  // The address names the chat shown, so it can be linked and survives a reload.
  createEffect(() => {
    const path = chatPath(current());
    if (path && location.pathname !== path && (location.pathname === '/' || chatIdInPath(location.pathname) != null)) {
      history.replaceState(null, '', path);
    }
  });
  const problem = () => settingsProblem(current(), chosen());

  return (
    <div class="chat" classList={{ 'sidebar-open': sidebarOpen() }} data-testid="chat-view">
      <aside class="sidebar" data-testid="conversation-list" data-loaded={chat.loaded ? 'true' : 'false'}>
        <button
          class="btn primary wide"
          data-testid="new-chat"
          onClick={() => {
            newChat();
            setSidebarOpen(false);
            input.focus();
          }}
        >
          + New chat
        </button>
        <ul class="conv-list">
          <For each={chat.conversations}>
            {(c) => (
              <li
                class="conv"
                classList={{ active: c.id === chat.currentId }}
                data-testid="conversation-item"
                data-id={c.id}
                data-server-id={c.serverId ?? ''}
              >
                <button
                  class="conv-title"
                  title={c.title}
                  onClick={() => {
                    selectChat(c.id);
                    setSidebarOpen(false);
                  }}
                >
                  {c.title}
                </button>
                <button
                  class="icon-btn small"
                  title="Delete this chat"
                  aria-label="Delete this chat"
                  data-testid="delete-conversation"
                  onClick={() => removeChat(c.id)}
                >
                  ×
                </button>
              </li>
            )}
          </For>
        </ul>
      </aside>
      <div class="sidebar-scrim" onClick={() => setSidebarOpen(false)} />

      <section class="chat-main">
        <div class="chat-toolbar">
          <button
            class="icon-btn sidebar-toggle"
            data-testid="sidebar-toggle"
            title="Chats"
            aria-label="Chats"
            onClick={() => setSidebarOpen(!sidebarOpen())}
          >
            ☰
          </button>
          <label class="model-pick">
            <span class="muted">Model</span>
            <select
              data-testid="model-picker"
              title={chosen() ? modelLabel(chosen()!) : ''}
              value={effectiveModel(current())}
              disabled={lib.models.length === 0}
              onChange={(e) => updateSettings({ model: e.currentTarget.value })}
            >
              <Show when={lib.models.length === 0}>
                <option value="">{lib.error ? 'unavailable' : 'loading…'}</option>
              </Show>
              <For each={chatModels()}>
                {(m) => (
                  <option
                    value={m.id}
                    selected={m.id === effectiveModel(current())}
                    data-quant={m.shoal?.quantization ?? ''}
                    data-size={m.shoal?.size_bytes ?? ''}
                    data-loaded={m.shoal?.loaded ? 'true' : 'false'}
                    data-source={m.shoal?.source?.kind ?? ''}
                  >
                    {modelLabel(m)}
                  </option>
                )}
              </For>
            </select>
          </label>
          <Show when={chosen()}>
            {(m) => (
              <Show
                when={m().shoal?.loaded}
                fallback={
                  <span
                    class="tag model-state"
                    data-testid="model-state-chosen"
                    data-loaded="false"
                    title={`Not in memory: it loads with the next message (about ${fmtBytes(m().shoal?.estimated_memory_bytes)}), so that reply starts later`}
                  >
                    loads on first use
                  </span>
                }
              >
                <span class="tag model-state" data-testid="model-state-chosen" data-loaded="true" title="In memory">
                  loaded
                </span>
              </Show>
            )}
          </Show>
          <span class="spacer" />
          <Show when={(current()?.messages.length ?? 0) > 0}>
            <details class="menu" data-testid="export-menu">
              <summary class="btn" title="Save this chat as a file, each reply with its usage and finish reason">
                Export
              </summary>
              <div class="menu-items">
                <button
                  class="btn small"
                  data-testid="export-markdown"
                  onClick={(e) => {
                    download(fileName(current()!, 'md'), 'text/markdown', chatMarkdown(current()!));
                    e.currentTarget.closest('details')?.removeAttribute('open');
                  }}
                >
                  Markdown
                </button>
                <button
                  class="btn small"
                  data-testid="export-json"
                  onClick={(e) => {
                    download(fileName(current()!, 'json'), 'application/json', chatJson(current()!));
                    e.currentTarget.closest('details')?.removeAttribute('open');
                  }}
                >
                  JSON
                </button>
              </div>
            </details>
          </Show>
          <button
            class="btn"
            classList={{ active: modelsOpen() }}
            data-testid="models-toggle"
            aria-expanded={modelsOpen()}
            title="Models on this server: disk and memory use, load, unload, delete, download"
            onClick={() => setModelsOpen(!modelsOpen())}
          >
            Models
          </button>
          <button
            class="btn"
            classList={{ active: settingsOpen() }}
            data-testid="settings-toggle"
            aria-expanded={settingsOpen()}
            onClick={() => {
              if (!current()) newChat();
              setSettingsOpen(!settingsOpen());
            }}
          >
            Settings
          </button>
        </div>

        <div class="chat-body">
          <div class="chat-conv">
            <Show when={lib.error}>
              <ErrorBanner testid="models-error" action={{ label: 'Retry', onClick: () => void loadModels() }}>
                {lib.error}
              </ErrorBanner>
            </Show>

            <Show when={chat.loadError}>
              <ErrorBanner testid="store-load-error" action={{ label: 'Retry', onClick: () => void loadConversations() }}>
                {chat.loadError}
              </ErrorBanner>
            </Show>

            <Show when={chat.storeError}>
              <ErrorBanner testid="store-error" action={{ label: 'Dismiss', title: 'Dismiss', onClick: dismissStoreError }}>
                {chat.storeError}
              </ErrorBanner>
            </Show>

            <div class="messages" ref={scroller} onScroll={onScroll} data-testid="messages">
              <Show
                when={(current()?.messages.length ?? 0) > 0}
                fallback={
                  <div class="empty" data-testid="empty-chat">
                    <p>Ask the model something.</p>
                    <p class="muted">Enter sends · Shift+Enter adds a line · Esc stops a reply</p>
                  </div>
                }
              >
                <For each={current()?.messages}>
                  {(m, i) => (
                    <MessageView
                      msg={m}
                      continues={isContinuation(current()!.messages, i())}
                      last={i() === current()!.messages.length - 1}
                      streaming={chat.streaming?.messageId === m.id}
                      busy={!!chat.streaming}
                      blocked={problem()}
                    />
                  )}
                </For>
              </Show>
            </div>

            <form
              class="composer"
              onSubmit={(e) => {
                e.preventDefault();
                send();
              }}
            >
              <textarea
                ref={input}
                data-testid="composer-input"
                rows={2}
                placeholder="Message (Enter to send, Shift+Enter for a new line)"
                value={draft()}
                onInput={(e) => setDraft(e.currentTarget.value)}
                onKeyDown={(e) => {
                  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
                    e.preventDefault();
                    send();
                  }
                }}
              />
              <Show
                when={chat.streaming}
                fallback={
                  <button
                    class="btn primary"
                    type="submit"
                    data-testid="send-button"
                    disabled={!draft().trim() || !!problem()}
                    title={problem() ?? ''}
                  >
                    Send
                  </button>
                }
              >
                <button class="btn danger" type="button" data-testid="stop-button" title="Stop (Esc)" onClick={stopReply}>
                  Stop
                </button>
              </Show>
            </form>
          </div>

          {/* Beside the conversation in a wide window (above it in a narrow one), both panels in one column that
              scrolls on its own: the conversation keeps its width and height whichever are open. */}
          <Show when={modelsOpen() || settingsOpen()}>
            <aside class="chat-side" data-testid="chat-side">
              <Show when={settingsOpen()}>
                <Show when={current()} keyed>
                  {(c) => <SettingsPanel conv={c} model={chosen()} />}
                </Show>
              </Show>
              <Show when={modelsOpen()}>
                <ModelsPanel selected={effectiveModel(current())} onUse={(id) => updateSettings({ model: id })} />
              </Show>
            </aside>
          </Show>
        </div>
      </section>
    </div>
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

function MessageView(props: {
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
        <div class="msg user" data-testid="message-user" data-saved={m().saved}>
          <Show
            when={editing() != null}
            fallback={
              <>
                <div class="bubble" data-testid="user-content">
                  {m().content}
                </div>
                <div class="msg-actions">
                  <CopyButton text={() => m().content} testid="copy-message" />
                  <button
                    class="btn small ghost"
                    type="button"
                    data-testid="edit-message"
                    disabled={props.busy}
                    title="Change this message and send it again; the replies after it are replaced"
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
                onKeyDown={(e) => e.key === 'Escape' && setEditing(null)}
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
        <div class="bubble">
          <Show when={m().content || !props.streaming} fallback={<span class="typing" data-testid="waiting">…</span>}>
            <Markdown text={m().content} live={props.streaming} />
            <Show when={!m().content && !m().error}>
              <span class="muted" data-testid="no-answer">
                {m().reasoning ? '(no answer after the reasoning)' : '(no text)'}
              </span>
            </Show>
          </Show>
          <Show when={m().error}>
            <div class="error-text" role="alert" data-testid="error-message">
              {m().error}
            </div>
          </Show>
        </div>
        <div class="msg-foot">
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
                      title={props.blocked ?? 'A new reply to the same message, in place of this one'}
                      onClick={retryLast}
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

function decodeStop(line: string): string {
  return line.replace(/\\(n|t|\\)/g, (_, c) => (c === 'n' ? '\n' : c === 't' ? '\t' : '\\'));
}

function encodeStop(s: string): string {
  return s.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/\t/g, '\\t');
}

/** Why `max` cannot be a reply cap for a model with this window; null when it can. */
function maxTokensProblem(max: number | null, context: number | null | undefined): string | null {
  if (max == null) return null;
  if (!Number.isInteger(max) || max < 1) return 'Max tokens must be a whole number of at least 1';
  if (context && max > context) {
    return `Max tokens ${max.toLocaleString('en-US')} is more than the model's ${context.toLocaleString('en-US')}-token window`;
  }
  return null;
}

function numberOrNull(v: string): number | null {
  if (v.trim() === '') return null;
  const n = Number(v);
  return Number.isFinite(n) ? n : null;
}

/** Per-chat settings; inputs start from the chat's saved values and write back as you type. */
function SettingsPanel(props: { conv: Conversation; model: ModelInfo | undefined }) {
  const s = untrack(() => props.conv.settings);
  const context = () => props.model?.shoal?.context_length ?? null;
  // Text that is not a number leaves the setting empty; it is refused until fixed or the panel closes.
  onCleanup(() => setUnreadable({}));
  const onNumber = (key: string, label: string, el: HTMLInputElement, save: (v: number | null) => void) => {
    const n = el.validity.badInput ? null : numberOrNull(el.value);
    const bad = el.validity.badInput || (el.value.trim() !== '' && n == null);
    setUnreadable(({ [key]: _, ...rest }) => (bad ? { ...rest, [key]: `${label} must be a number` } : rest));
    save(n);
  };
  const maxProblem = () => unreadable().maxTokens ?? maxTokensProblem(props.conv.settings.maxTokens, context());
  /** Whether the chat's model can reason (`null` until the server knows). */
  const reasons = () => (props.model ? canReason(props.model.id) : null);
  const field = (key: SamplingField['key']) => SAMPLING.find((f) => f.key === key)!;
  const sampling = (f: SamplingField) => <SamplingInput field={f} conv={props.conv} model={props.model} onNumber={onNumber} />;
  return (
    <div class="settings" data-testid="settings-panel">
      <b class="span2">Settings of this chat</b>
      <label class="field span2">
        <span>System prompt</span>
        <textarea
          data-testid="setting-system"
          rows={2}
          placeholder="Empty: the model's default"
          value={s.systemPrompt}
          onInput={(e) => updateSettings({ systemPrompt: e.currentTarget.value })}
        />
      </label>
      {sampling(field('temperature'))}
      <label class="field">
        <span>Max tokens</span>
        <input
          data-testid="setting-max-tokens"
          type="number"
          min="1"
          max={context() ?? undefined}
          step="1"
          placeholder="the context window"
          value={s.maxTokens ?? ''}
          aria-invalid={maxProblem() ? 'true' : 'false'}
          onInput={(e) => onNumber('maxTokens', 'Max tokens', e.currentTarget, (v) => updateSettings({ maxTokens: v }))}
        />
        <Show when={context()}>
          <span class="muted small field-note" data-testid="context-window">
            of a {context()!.toLocaleString('en-US')}-token window
          </span>
        </Show>
        <Show when={maxProblem()}>
          <span class="error-text small" role="alert" data-testid="setting-max-tokens-error">
            {maxProblem()}
          </span>
        </Show>
      </label>
      <For each={SAMPLING.filter((f) => f.key !== 'temperature')}>{sampling}</For>
      <label class="field">
        <span>Stop sequences</span>
        <textarea
          data-testid="setting-stop"
          rows={2}
          placeholder={'one per line (\\n for a newline)'}
          value={s.stop.map(encodeStop).join('\n')}
          onInput={(e) =>
            updateSettings({
              stop: e.currentTarget.value
                .split('\n')
                .filter((l) => l !== '')
                .map(decodeStop),
            })
          }
        />
      </label>
      <label class="field check">
        <input
          data-testid="setting-reasoning"
          type="checkbox"
          checked={s.reasoning && reasons() !== false}
          disabled={reasons() === false}
          onChange={(e) => updateSettings({ reasoning: e.currentTarget.checked })}
        />
        <span title='Sends reasoning_effort: "low"; the thinking shows in a collapsible block above the answer'>Reasoning</span>
        <Show when={reasons() === false}>
          <span class="muted small" data-testid="reasoning-unavailable">
            This model cannot reason: it has no thinking section of its own, so it answers directly.
          </span>
        </Show>
      </label>
      <ServerSettings />
    </div>
  );
}

/**
 * One sampling setting: empty, the model's default applies, named beside the
 * field with where it came from (`/v1/models` `sampling_defaults`); a value
 * overrides it for this chat.
 */
function SamplingInput(props: {
  field: SamplingField;
  conv: Conversation;
  model: ModelInfo | undefined;
  onNumber: (key: string, label: string, el: HTMLInputElement, save: (v: number | null) => void) => void;
}) {
  const f = props.field;
  const id = `setting-${f.wire.replace(/_/g, '-')}`;
  const def = () => (f.wire === 'seed' ? undefined : props.model?.shoal?.sampling_defaults?.[f.wire]);
  const problem = () => unreadable()[f.key] ?? samplingProblem(f, props.conv.settings[f.key]);
  const note = () => {
    if (f.wire === 'seed') return 'default: none, a new random draw each reply';
    const d = def();
    if (!d) return "default: the model's";
    return `default ${d.value}${d.value === f.off ? ' (off)' : ''} · ${d.source}`;
  };
  return (
    <label class="field">
      <span title={f.hint}>{f.label}</span>
      <input
        data-testid={id}
        type="number"
        min={f.min}
        max={Number.isFinite(f.max) ? f.max : undefined}
        step={f.step}
        placeholder={def() ? `model default ${def()!.value}` : f.wire === 'seed' ? 'random' : 'model default'}
        title={f.hint}
        data-default={def()?.value ?? ''}
        data-default-source={def()?.source ?? ''}
        value={untrack(() => props.conv.settings[f.key]) ?? ''}
        aria-invalid={problem() ? 'true' : 'false'}
        onInput={(e) => props.onNumber(f.key, f.label, e.currentTarget, (v) => updateSettings({ [f.key]: v }))}
      />
      <span class="muted small field-note" data-testid={`${id}-default`}>
        {note()}
      </span>
      <Show when={problem()}>
        <span class="error-text small" role="alert" data-testid={`${id}-error`}>
          {problem()}
        </span>
      </Show>
    </label>
  );
}
