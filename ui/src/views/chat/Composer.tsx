// The composer under a chat: the message box with its Send and Stop buttons. Apart from Chat.tsx
// because the draft and how it is sent belong to it alone; the view hands it what blocks sending
// and takes its text box back (to focus it).
import { createSignal, Show } from 'solid-js';
import { chat, sendMessage, stopReply } from '../../chatState';

export function Composer(props: {
  /** Why the chat's settings cannot be sent as they are; null when they can. */
  problem: string | null;
  /** The message box, for the view to focus. */
  ref: HTMLTextAreaElement | ((el: HTMLTextAreaElement) => void);
}) {
  const [draft, setDraft] = createSignal('');

  const send = () => {
    const text = draft();
    if (!text.trim() || chat.streaming || props.problem) return;
    setDraft('');
    void sendMessage(text);
  };

  return (
    <form
      class="composer"
      onSubmit={(e) => {
        e.preventDefault();
        send();
      }}
    >
      <textarea
        ref={props.ref}
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
            disabled={!draft().trim() || !!props.problem}
            title={props.problem ?? ''}
          >
            Send
          </button>
        }
      >
        <button class="btn danger" type="button" data-testid="stop-button" title="Stop (Esc)" onClick={stopReply}>
          Stop
        </button>
      </Show>
      {/* Why Send is off, in words a touch screen shows too (a title never appears there). */}
      <Show when={!chat.streaming && props.problem}>
        <p class="send-reason" data-testid="send-reason" role="status">
          {props.problem}
        </p>
      </Show>
    </form>
  );
}
