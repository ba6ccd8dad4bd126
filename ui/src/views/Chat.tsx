import { createEffect, createSignal, For, on, onCleanup, onMount, Show } from 'solid-js';
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
  stopReply,
  updateSettings,
} from '../chatState';
import { ErrorBanner } from '../components/ErrorBanner';
import { modelLabel, ModelsPanel } from '../components/ModelsPanel';
import { chatJson, chatMarkdown, download, fileName, isContinuation } from '../share';
import { fmtBytes } from '../format';
import { chatModels, lib, modelById } from '../models';
import { ChatList } from './chat/ChatList';
import { Composer } from './chat/Composer';
import { MessageView } from './chat/MessageView';
import { SettingsPanel, settingsProblem } from './chat/SettingsPanel';

export function ChatView() {
  const [settingsOpen, setSettingsOpen] = createSignal(false);
  const [modelsOpen, setModelsOpen] = createSignal(false);
  const [sidebarOpen, setSidebarOpen] = createSignal(false);
  let input!: HTMLTextAreaElement;
  let scroller!: HTMLDivElement;

  onMount(() => {
    void initChat();
    input.focus();
  });

  // Esc stops a reply; Shift+Esc puts the cursor in the message box; Ctrl+Shift+O (⌘⇧O) starts a
  // new chat, as in other chat apps.
  const onKey = (e: KeyboardEvent) => {
    if (e.key === 'Escape' && e.shiftKey) {
      e.preventDefault();
      input.focus();
    } else if (e.key === 'Escape' && chat.streaming) {
      e.preventDefault();
      stopReply();
    } else if ((e.ctrlKey || e.metaKey) && e.shiftKey && e.key.toLowerCase() === 'o') {
      e.preventDefault();
      newChat();
      input.focus();
    }
  };
  document.addEventListener('keydown', onKey);
  onCleanup(() => document.removeEventListener('keydown', onKey));

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
        <ChatList onChosen={() => setSidebarOpen(false)} />
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
                  <Show
                    when={chat.missing == null || current()}
                    fallback={
                      <div class="empty" data-testid="chat-not-found" role="status">
                        <p>This chat was not found: it may have been deleted.</p>
                        <button
                          class="btn primary"
                          data-testid="chat-not-found-new"
                          onClick={() => {
                            newChat();
                            input.focus();
                          }}
                        >
                          Start a new chat
                        </button>
                      </div>
                    }
                  >
                    <div class="empty" data-testid="empty-chat">
                      <p>Ask the model something.</p>
                      <p class="muted" data-testid="keyboard-hint">
                        Enter sends · Shift+Enter adds a line · Esc stops a reply · Shift+Esc goes to the message box ·
                        Ctrl+Shift+O starts a new chat
                      </p>
                    </div>
                  </Show>
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

            <Composer ref={input} problem={problem()} />
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
