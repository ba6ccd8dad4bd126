// The chat list beside the conversation: search, chats grouped by when they were last used, and
// each chat's rename and delete. Apart from Chat.tsx because it is a whole panel of its own, with
// state (the search, the chat being renamed) nothing else reads.
import { createMemo, createSignal, For, type JSX, Show } from 'solid-js';
import { chat, removeChat, renameChat, selectChat } from '../../chatState';
import type { Conversation } from '../../store';

/** The groups of the list, newest first, as other chat apps name them. */
const GROUPS = ['Today', 'Yesterday', 'Previous 7 days', 'Previous 30 days', 'Older'] as const;
type Group = (typeof GROUPS)[number];

/** Which group a chat last used at `ms` falls in, seen at `now`. */
export function groupOf(ms: number, now: Date): Group {
  const midnight = new Date(now.getFullYear(), now.getMonth(), now.getDate()).getTime();
  const day = 86_400_000;
  if (ms >= midnight) return 'Today';
  if (ms >= midnight - day) return 'Yesterday';
  if (ms >= midnight - 7 * day) return 'Previous 7 days';
  if (ms >= midnight - 30 * day) return 'Previous 30 days';
  return 'Older';
}

/** Whether a chat's title or any message holds every word of `query` (case aside). */
function matches(c: Conversation, query: string): boolean {
  const words = query.toLowerCase().split(/\s+/).filter(Boolean);
  if (words.length === 0) return true;
  const text = [c.title, ...c.messages.map((m) => m.content)].join('\n').toLowerCase();
  return words.every((w) => text.includes(w));
}

export function ChatList(props: {
  /** After a chat was chosen (the narrow window's drawer closes). */
  onChosen: () => void;
}) {
  const [query, setQuery] = createSignal('');
  const groups = createMemo(() => {
    const now = new Date();
    const shown = chat.conversations.filter((c) => matches(c, query()));
    return GROUPS.map((g) => ({ name: g, chats: shown.filter((c) => groupOf(c.updated, now) === g) })).filter(
      (g) => g.chats.length > 0,
    );
  });
  return (
    <>
      <input
        type="search"
        class="chat-search"
        data-testid="chat-search"
        placeholder="Search chats"
        aria-label="Search chats"
        value={query()}
        onInput={(e) => setQuery(e.currentTarget.value)}
      />
      <Show when={query() && groups().length === 0}>
        <p class="muted small" data-testid="chat-search-empty">
          No chat has that in its title or messages.
        </p>
      </Show>
      <div class="conv-groups">
        <For each={groups()}>
          {(g) => (
            <section class="conv-group" data-testid="chat-group" data-group={g.name}>
              <h3 class="conv-group-name">{g.name}</h3>
              <ul class="conv-list">
                <For each={g.chats}>{(c) => <ChatItem conv={c} onChosen={props.onChosen} />}</For>
              </ul>
            </section>
          )}
        </For>
      </div>
    </>
  );
}

function ChatItem(props: { conv: Conversation; onChosen: () => void }) {
  const [renaming, setRenaming] = createSignal(false);
  const c = () => props.conv;
  // Esc ends renaming, and the input's blur as it goes must not keep what Esc dropped.
  const done = (input: HTMLInputElement, keep: boolean) => {
    if (!renaming()) return;
    setRenaming(false);
    if (keep) renameChat(c().id, input.value);
  };
  return (
    <li
      class="conv"
      classList={{ active: c().id === chat.currentId }}
      data-testid="conversation-item"
      data-id={c().id}
      data-server-id={c().serverId ?? ''}
    >
      <Show
        when={renaming()}
        fallback={
          <>
            <button
              class="conv-title"
              title={titleHint(c())}
              data-testid="conversation-title"
              data-titled-by={c().titleBy?.responseId ?? ''}
              onClick={() => {
                selectChat(c().id);
                props.onChosen();
              }}
              onDblClick={() => setRenaming(true)}
            >
              {c().title}
            </button>
            <ChatAction label="Rename this chat" testid="rename-conversation" onClick={() => setRenaming(true)}>
              ✎
            </ChatAction>
            <DeleteChat id={c().id} title={c().title} />
          </>
        }
      >
        <input
          class="conv-rename"
          data-testid="rename-input"
          aria-label="The chat's name"
          value={c().title}
          ref={(el) => queueMicrotask(() => el.select())}
          onKeyDown={(e) => {
            if (e.key === 'Enter') done(e.currentTarget, true);
            else if (e.key === 'Escape') done(e.currentTarget, false);
          }}
          onBlur={(e) => done(e.currentTarget, true)}
        />
      </Show>
    </li>
  );
}

/** A chat's small icon button: its one label is both the tooltip and what a screen reader says
 * (the icon alone says nothing). */
function ChatAction(props: { label: string; testid: string; onClick: () => void; children: JSX.Element }) {
  return (
    <button
      class="icon-btn small"
      title={props.label}
      aria-label={props.label}
      data-testid={props.testid}
      onClick={() => props.onClick()}
    >
      {props.children}
    </button>
  );
}

/** A chat's delete button: asks first, in place, as deleting a model does (deleting is final). */
function DeleteChat(props: { id: string; title: string }) {
  const [asking, setAsking] = createSignal(false);
  return (
    <Show
      when={asking()}
      fallback={
        <ChatAction label="Delete this chat" testid="delete-conversation" onClick={() => setAsking(true)}>
          ×
        </ChatAction>
      }
    >
      <span class="confirm" data-testid="delete-conversation-confirm">
        <button
          class="btn small danger"
          data-testid="delete-conversation-yes"
          title={`Delete "${props.title}" for good`}
          onClick={() => {
            setAsking(false);
            removeChat(props.id);
          }}
        >
          Delete
        </button>
        <button class="btn small" data-testid="delete-conversation-no" onClick={() => setAsking(false)}>
          Keep
        </button>
      </span>
    </Show>
  );
}

/** A chat's full title, and who wrote it when its model did (with what that cost). */
function titleHint(c: Conversation): string {
  const t = c.titleBy;
  if (!t) return c.title;
  return `${c.title}\nTitle written by ${t.model}: ${t.promptTokens + t.completionTokens} tokens (${t.completionTokens} written)`;
}
