import { createResource, createSignal, Show } from 'solid-js';
import { getOllamaPort, setOllamaPort, type OllamaPortSetting } from '../api';

/** What the Ollama switch's state means for a user, in one sentence. */
function describe(s: OllamaPortSetting): string {
  if (!s.enabled) return `Off: Ollama's API answers on this server's own port (${location.host}/api/…) only.`;
  if (s.listening) return `On: tools that look for Ollama at localhost:${s.port} find Shoal there (${s.address}).`;
  return s.error ?? `Port ${s.port} does not listen.`;
}

/** Settings of the server itself (for every chat and every client): Ollama's own port. */
export function ServerSettings() {
  const [setting, { mutate }] = createResource(getOllamaPort);
  const [busy, setBusy] = createSignal(false);
  const [failed, setFailed] = createSignal<string | null>(null);
  const toggle = async (enabled: boolean) => {
    setBusy(true);
    setFailed(null);
    try {
      mutate(await setOllamaPort(enabled, setting()?.port));
    } catch (e) {
      setFailed((e as Error).message);
    } finally {
      setBusy(false);
    }
  };
  return (
    <fieldset class="field span2 server-settings" data-testid="server-settings">
      <legend>Server (every chat and client)</legend>
      <Show when={setting()} fallback={<span class="muted">{setting.error ? `Unavailable: ${setting.error.message}` : 'Loading…'}</span>}>
        {(s) => (
          <>
            <label class="check">
              <input
                type="checkbox"
                data-testid="setting-ollama-port"
                checked={s().enabled}
                disabled={busy()}
                onChange={(e) => void toggle(e.currentTarget.checked)}
              />
              <span>Also answer on Ollama's port {s().port}</span>
            </label>
            <p
              class="muted"
              classList={{ warn: s().enabled && !s().listening }}
              role={s().enabled && !s().listening ? 'alert' : undefined}
              data-testid="ollama-port-status"
              data-listening={String(s().listening)}
            >
              {describe(s())}
            </p>
          </>
        )}
      </Show>
      <Show when={failed()}>
        <p class="warn" role="alert" data-testid="ollama-port-error">{failed()}</p>
      </Show>
    </fieldset>
  );
}
