// Small display helpers.

export function fmtInt(n: number | null | undefined): string {
  return n == null || !Number.isFinite(n) ? '—' : Math.round(n).toLocaleString('en-US');
}

export function fmtMs(ms: number | null | undefined): string {
  if (ms == null || !Number.isFinite(ms)) return '—';
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`;
}

export function fmtRate(r: number | null | undefined): string {
  return r == null || !Number.isFinite(r) || r <= 0 ? '—' : r >= 100 ? r.toFixed(0) : r.toFixed(1);
}

export function fmtBytes(b: number | null | undefined): string {
  if (b == null || !Number.isFinite(b)) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = b;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)} ${units[i]}`;
}

export function fmtAgo(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 2) return 'just now';
  if (s < 60) return `${s} s ago`;
  const m = Math.round(s / 60);
  if (m < 60) return `${m} min ago`;
  return `${Math.round(m / 60)} h ago`;
}

export function fmtTime(epochSeconds: number): string {
  const d = new Date(epochSeconds * 1000);
  return d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
}

/** A moment with its day, e.g. "Dec 6, 14:05:09": a log spans days. */
export function fmtDateTime(epochSeconds: number): string {
  const d = new Date(epochSeconds * 1000);
  return `${d.toLocaleDateString([], { month: 'short', day: 'numeric' })}, ${fmtTime(epochSeconds)}`;
}

/** How the engine behind a model is called in the UI. */
export function backendName(b: string): string {
  return b === 'llama' ? 'llama.cpp' : b === 'mlx' ? 'MLX' : b;
}

/** `part` as a share of `whole` ("41.7%"), or "—" when either is unknown or whole is 0. */
export function fmtShare(part: number | null | undefined, whole: number | null | undefined): string {
  if (part == null || whole == null || !whole) return '—';
  return `${((part * 100) / whole).toFixed(1)}%`;
}

/** A cost in the prices' own unit: cents' worth to two places, small sums to three significant digits. */
export function fmtCost(n: number | null | undefined): string {
  if (n == null || !Number.isFinite(n)) return '—';
  if (n === 0) return '0';
  return n >= 1 ? n.toFixed(2) : n.toPrecision(3);
}
