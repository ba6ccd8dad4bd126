import { createEffect, createSignal, on, Show } from 'solid-js';
import { forgetKey, hasKey, keyRequest, submitKey } from '../auth';

/**
 * Asks for the API key when the server answered 401 (auth.ts opens it). The
 * key goes from the password field to the server's check and to localStorage;
 * it is never shown. A key the server refuses gets the server's message.
 */
export function KeyPrompt() {
  const [error, setError] = createSignal<string | null>(null);
  const [busy, setBusy] = createSignal(false);
  let input: HTMLInputElement | undefined;

  // Each time the prompt opens: the server's word on the key it had, if any.
  createEffect(
    on(keyRequest, (r) => {
      setError(r?.refused ?? null);
      if (r) queueMicrotask(() => input?.focus());
    }),
  );

  const submit = async (e: SubmitEvent) => {
    e.preventDefault();
    if (busy() || !input) return;
    const field = input;
    setBusy(true);
    try {
      const why = await submitKey(field.value);
      field.value = '';
      setError(why);
      if (why) field.focus();
    } finally {
      setBusy(false);
    }
  };

  return (
    <Show when={keyRequest()}>
      <div class="modal-scrim" data-testid="key-prompt">
        <form
          class="modal"
          role="dialog"
          aria-modal="true"
          aria-labelledby="key-prompt-title"
          aria-describedby="key-prompt-text"
          method="post"
          autocomplete="off"
          onSubmit={(e) => void submit(e)}
        >
          <h2 id="key-prompt-title">This server requires an API key</h2>
          <p id="key-prompt-text" class="muted">
            Enter one of the keys it was started with (<code>--api-key</code>). It is kept in this browser until you
            choose “Forget key”.
          </p>
          <label class="field">
            <span>API key</span>
            <input
              ref={input}
              type="password"
              data-testid="key-input"
              autocomplete="off"
              spellcheck={false}
              autocapitalize="off"
              required
            />
          </label>
          <Show when={error()}>
            <div class="banner error" role="alert" data-testid="key-error">
              {error()}
            </div>
          </Show>
          <div class="modal-actions">
            <button type="submit" class="btn primary" data-testid="key-submit" disabled={busy()}>
              {busy() ? 'Checking…' : 'Unlock'}
            </button>
          </div>
        </form>
      </div>
    </Show>
  );
}

/** The header's "Forget key", shown while a key is kept: drops it and reloads the page. */
export function ForgetKeyButton() {
  return (
    <Show when={hasKey()}>
      <button
        class="btn small forget-key"
        data-testid="forget-key"
        title="Forget the API key kept in this browser"
        aria-label="Forget key"
        onClick={() => {
          forgetKey();
          location.reload();
        }}
      >
        <svg viewBox="0 0 16 16" width="14" height="14" aria-hidden="true">
          <circle cx="5" cy="8" r="3" fill="none" stroke="currentColor" stroke-width="1.6" />
          <path d="M8 8h7M12.5 8v3M14.5 8v2" fill="none" stroke="currentColor" stroke-width="1.6" />
        </svg>
        <span class="forget-key-label">Forget key</span>
      </button>
    </Show>
  );
}
