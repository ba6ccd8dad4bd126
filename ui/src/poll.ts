import { createSignal, onCleanup } from 'solid-js';

/**
 * Calls `load` now and every `ms` while the calling component is mounted.
 * A timed call is skipped while another runs; `refresh` (for a changed
 * filter) starts one at once, and only the newest call's result is kept,
 * so an older load finishing late never shows stale data. Returns the last
 * value, the last error (cleared on success) and when the last success was.
 */
export function usePoll<T>(load: () => Promise<T>, ms: number) {
  const [data, setData] = createSignal<T | undefined>(undefined);
  const [error, setError] = createSignal<string | null>(null);
  const [updated, setUpdated] = createSignal<number | null>(null);
  let running = 0;
  let newest = 0;
  let alive = true;
  const run = async (asked: boolean) => {
    if (!alive || (!asked && running > 0)) return;
    const mine = ++newest;
    running += 1;
    try {
      const v = await load();
      if (!alive || mine !== newest) return;
      setData(() => v);
      setError(null);
      setUpdated(Date.now());
    } catch (e) {
      if (alive && mine === newest) setError((e as Error).message);
    } finally {
      running -= 1;
    }
  };
  void run(true);
  const timer = setInterval(() => void run(false), ms);
  onCleanup(() => {
    alive = false;
    clearInterval(timer);
  });
  return { data, error, updated, refresh: () => run(true) };
}
