import { createEffect, createSignal, For, on, onCleanup, onMount, Show, untrack } from 'solid-js';
import {
  chat,
  current,
  chatIdInPath,
  chatPath,
  dismissStoreError,
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
import { fmtBytes } from '../format';
import { canReason, chatModels, lib, modelById } from '../models';
import type { ModelInfo } from '../api';
import type { Conversation, Message } from '../store';

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
    if (!text.trim() || chat.streaming || settingsProblem()) return;
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
  /** Why the chat's settings cannot be sent as they are (checked before sending). */
  const settingsProblem = () => {
    const c = current();
    return c ? maxTokensProblem(c.settings.maxTokens, chosen()?.shoal?.context_length) : null;
  };

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

        <Show when={modelsOpen()}>
          <ModelsPanel selected={effectiveModel(current())} onUse={(id) => updateSettings({ model: id })} />
        </Show>

        <Show when={settingsOpen()}>
          <Show when={current()} keyed>
            {(c) => <SettingsPanel conv={c} model={chosen()} />}
          </Show>
        </Show>

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
              {(m) => <MessageView msg={m} streaming={chat.streaming?.messageId === m.id} />}
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
                disabled={!draft().trim() || !!settingsProblem()}
                title={settingsProblem() ?? ''}
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
      </section>
    </div>
  );
}

function MessageView(props: { msg: Message; streaming: boolean }) {
  const m = () => props.msg;
  return (
    <Show
      when={m().role === 'assistant'}
      fallback={
        <div class="msg user" data-testid="message-user" data-saved={m().saved}>
          <div class="bubble">{m().content}</div>
          <Show when={m().saved === 'failed'}>
            <NotSaved />
          </Show>
        </div>
      }
    >
      <div
        class="msg assistant"
        data-testid="message-assistant"
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
            <div class="md" data-testid="assistant-content" innerHTML={renderMarkdown(m().content)} />
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
          <Show when={m().finish}>
            <FinishBadge finish={m().finish!} stopSequence={m().stopSequence} />
          </Show>
          <Show when={m().stats && !(m().finish === 'error' && m().stats!.completion === 0)}>
            <UsageStats stats={m().stats!} />
          </Show>
          <Show when={(m().finish === 'error' || m().finish === 'cancelled') && !props.streaming}>
            <button class="btn small" data-testid="retry" onClick={retryLast}>
              Retry
            </button>
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
  // What was typed, so text that is not a number is refused too.
  const [maxText, setMaxText] = createSignal(s.maxTokens == null ? '' : String(s.maxTokens));
  const maxProblem = () =>
    maxText().trim() !== '' && numberOrNull(maxText()) == null
      ? 'Max tokens must be a whole number'
      : maxTokensProblem(props.conv.settings.maxTokens, context());
  /** Whether the chat's model can reason (`null` until the server knows). */
  const reasons = () => (props.model ? canReason(props.model.id) : null);
  /** The model's own default for a setting left empty, and where it came from. */
  const modelDefault = (key: 'temperature') => props.model?.shoal?.sampling_defaults?.[key];
  return (
    <div class="settings" data-testid="settings-panel">
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
      <label class="field">
        <span>Temperature</span>
        <input
          data-testid="setting-temperature"
          type="number"
          min="0"
          max="2"
          step="0.1"
          placeholder={modelDefault('temperature') ? `model default ${modelDefault('temperature')!.value}` : 'model default'}
          title={modelDefault('temperature') ? `from ${modelDefault('temperature')!.source}` : ''}
          data-default={modelDefault('temperature')?.value ?? ''}
          data-default-source={modelDefault('temperature')?.source ?? ''}
          value={s.temperature ?? ''}
          onInput={(e) => updateSettings({ temperature: numberOrNull(e.currentTarget.value) })}
        />
      </label>
      <label class="field">
        <span>
          Max tokens
          <Show when={context()}>
            {' '}
            <span class="muted small" data-testid="context-window">
              of a {context()!.toLocaleString('en-US')}-token window
            </span>
          </Show>
        </span>
        <input
          data-testid="setting-max-tokens"
          type="number"
          min="1"
          max={context() ?? undefined}
          step="1"
          placeholder="the context window"
          value={s.maxTokens ?? ''}
          aria-invalid={maxProblem() ? 'true' : 'false'}
          onInput={(e) => {
            const raw = e.currentTarget.value;
            setMaxText(raw);
            updateSettings({ maxTokens: numberOrNull(raw) });
          }}
        />
        <Show when={maxProblem()}>
          <span class="error-text small" role="alert" data-testid="setting-max-tokens-error">
            {maxProblem()}
          </span>
        </Show>
      </label>
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
