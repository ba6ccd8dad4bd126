import { createResource, createSignal, Show } from 'solid-js';
import { clearCache, getCache, getOllamaPort, setOllamaPort, type CacheState, type OllamaPortSetting } from '../api';
import { fmtBytes } from '../format';

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
    <fieldset class="card server-settings" data-testid="server-settings">
      <legend>Ollama's port and the prompt cache</legend>
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
      <PromptCache />
    </fieldset>
  );
}

/** One sentence on what the prompt cache holds, in memory and on disk. */
function describeCache(c: CacheState): string {
  const ram = `${fmtBytes(c.ram.bytes)} in memory`;
  if (!c.disk) return `${ram}; the disk tier is off (cache.disk_mb).`;
  const d = c.disk;
  const disk = `${fmtBytes(d.bytes)} on disk in ${d.entries} ${d.entries === 1 ? 'entry' : 'entries'} (of ${fmtBytes(d.budget_bytes)})`;
  return `${ram}, ${disk}.`;
}

/** The prompt cache's size in RAM and on disk, and a Clear button. */
function PromptCache() {
  const [cache, { refetch }] = createResource(getCache);
  const [busy, setBusy] = createSignal(false);
  const [note, setNote] = createSignal<string | null>(null);
  const clear = async () => {
    setBusy(true);
    setNote(null);
    try {
      const r = await clearCache();
      setNote(`Removed ${r.disk_entries_removed} from disk; memory is cleared before each model's next request.`);
      await refetch();
    } catch (e) {
      setNote((e as Error).message);
    } finally {
      setBusy(false);
    }
  };
  return (
    <div class="prompt-cache" data-testid="prompt-cache">
      <span>Prompt cache</span>
      <p class="muted" data-testid="prompt-cache-size" data-disk-bytes={cache()?.disk?.bytes ?? ''}>
        {cache() ? describeCache(cache()!) : cache.error ? `Unavailable: ${cache.error.message}` : 'Loading…'}
      </p>
      <Show when={cache()?.disk?.writes_paused || cache()?.disk?.last_error}>
        <p class="warn" role="alert" data-testid="prompt-cache-error">
          {cache()?.disk?.writes_paused ? 'Writing to disk is paused: the disk is full. ' : ''}
          {cache()?.disk?.last_error}
        </p>
      </Show>
      <button type="button" data-testid="prompt-cache-clear" disabled={busy()} onClick={() => void clear()}>
        Clear
      </button>
      <Show when={note()}>
        <p class="muted" data-testid="prompt-cache-note">{note()}</p>
      </Show>
    </div>
  );
}
