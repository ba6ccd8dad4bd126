import { createSignal, onCleanup } from 'solid-js';

/**
 * Calls `load` now and every `ms` while the calling component is mounted
 * (never two at once). Returns the last value, the last error (cleared on
 * success) and when the last success was.
 */
export function usePoll<T>(load: () => Promise<T>, ms: number) {
  const [data, setData] = createSignal<T | undefined>(undefined);
  const [error, setError] = createSignal<string | null>(null);
  const [updated, setUpdated] = createSignal<number | null>(null);
  let busy = false;
  let alive = true;
  const tick = async () => {
    if (busy || !alive) return;
    busy = true;
    try {
      const v = await load();
      if (!alive) return;
      setData(() => v);
      setError(null);
      setUpdated(Date.now());
    } catch (e) {
      if (alive) setError((e as Error).message);
    } finally {
      busy = false;
    }
  };
  void tick();
  const timer = setInterval(() => void tick(), ms);
  onCleanup(() => {
    alive = false;
    clearInterval(timer);
  });
  return { data, error, updated, refresh: tick };
}
