// The composer under a chat: the message box with its Send and Stop buttons, and the images
// attached to the next message (picked, pasted or dropped). Apart from Chat.tsx because the draft
// and how it is sent belong to it alone; the view hands it what blocks sending and takes its text
// box back (to focus it).
import { createSignal, For, Show } from 'solid-js';
import { chat, current, effectiveModel, sendMessage, stopReply } from '../../chatState';
import { attachImage, IMAGE_TYPES } from '../../images';
import { canSee } from '../../models';
import type { ImageAttachment } from '../../store';

export function Composer(props: {
  /** Why the chat's settings cannot be sent as they are; null when they can. */
  problem: string | null;
  /** The message box, for the view to focus. */
  ref: HTMLTextAreaElement | ((el: HTMLTextAreaElement) => void);
}) {
  const [draft, setDraft] = createSignal('');
  const [images, setImages] = createSignal<ImageAttachment[]>([]);
  const [imageError, setImageError] = createSignal<string | null>(null);
  let picker: HTMLInputElement | undefined;

  const model = () => effectiveModel(current());
  /** Why images cannot go with the next message, or null when they can. */
  const noImages = () => (canSee(model()) === false ? `${model()} cannot read images (it has no vision projector)` : null);
  /** Images held for a model that cannot read them stop Send, with the reason said. */
  const problem = () => props.problem ?? (images().length && noImages() ? noImages() : null);

  const add = async (files: Iterable<File>) => {
    setImageError(null);
    for (const f of files) {
      if (!f.type.startsWith('image/')) continue;
      try {
        const img = await attachImage(f);
        setImages((list) => [...list, img]);
      } catch (e) {
        setImageError(e instanceof Error ? e.message : String(e));
      }
    }
  };

  const send = () => {
    const text = draft();
    if ((!text.trim() && images().length === 0) || chat.streaming || problem()) return;
    const attached = images();
    setDraft('');
    setImages([]);
    setImageError(null);
    void sendMessage(text, attached);
  };

  return (
    <form
      class="composer"
      classList={{ 'has-images': images().length > 0 }}
      onSubmit={(e) => {
        e.preventDefault();
        send();
      }}
      onDragOver={(e) => {
        if (e.dataTransfer?.types.includes('Files')) e.preventDefault();
      }}
      onDrop={(e) => {
        const files = e.dataTransfer?.files;
        if (!files?.length) return;
        e.preventDefault();
        void add(files);
      }}
    >
      <Show when={images().length > 0}>
        <div class="attached" data-testid="attached-images">
          <For each={images()}>
            {(img, i) => (
              <span class="attached-image" title={img.name ?? 'image'}>
                <img src={`data:${img.mediaType};base64,${img.data}`} alt={img.name ?? 'attached image'} />
                <button
                  type="button"
                  class="remove"
                  data-testid="remove-image"
                  aria-label={`Remove ${img.name ?? 'image'}`}
                  onClick={() => setImages((list) => list.filter((_, j) => j !== i()))}
                >
                  ×
                </button>
              </span>
            )}
          </For>
        </div>
      </Show>
      <textarea
        ref={props.ref}
        data-testid="composer-input"
        rows={2}
        placeholder="Message (Enter to send, Shift+Enter for a new line)"
        value={draft()}
        onInput={(e) => setDraft(e.currentTarget.value)}
        onPaste={(e) => {
          const files = [...(e.clipboardData?.files ?? [])].filter((f) => f.type.startsWith('image/'));
          if (files.length) {
            e.preventDefault();
            void add(files);
          }
        }}
        onKeyDown={(e) => {
          if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
            e.preventDefault();
            send();
          }
        }}
      />
      <input
        ref={picker}
        type="file"
        accept={IMAGE_TYPES.join(',')}
        multiple
        hidden
        data-testid="image-input"
        onChange={(e) => {
          const files = e.currentTarget.files;
          if (files) void add([...files]);
          e.currentTarget.value = '';
        }}
      />
      <button
        class="btn attach"
        type="button"
        data-testid="attach-button"
        disabled={!!noImages()}
        title={noImages() ?? 'Attach images (or paste or drop them here)'}
        aria-label="Attach images"
        onClick={() => picker?.click()}
      >
        {/* A picture: drawn here, so it shows without an emoji font. */}
        <svg viewBox="0 0 24 24" width="20" height="20" aria-hidden="true" fill="none" stroke="currentColor" stroke-width="2">
          <rect x="3" y="4" width="18" height="16" rx="2" />
          <circle cx="9" cy="10" r="2" />
          <path d="M21 17l-5-5-9 8" />
        </svg>
      </button>
      <Show
        when={chat.streaming}
        fallback={
          <button
            class="btn primary"
            type="submit"
            data-testid="send-button"
            disabled={(!draft().trim() && images().length === 0) || !!problem()}
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
      {/* Why Send is off, in words a touch screen shows too (a title never appears there). */}
      <Show when={!chat.streaming && problem()}>
        <p class="send-reason" data-testid="send-reason" role="status">
          {problem()}
        </p>
      </Show>
      <Show when={imageError()}>
        <p class="send-reason" data-testid="image-error" role="alert">
          {imageError()}
        </p>
      </Show>
    </form>
  );
}
