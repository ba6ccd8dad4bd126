import { createMemo, createSignal, For, onCleanup, onMount, Show } from 'solid-js';
import { usageLedger, type LedgerEntry } from '../api';
import { fmtAgo, fmtInt, fmtMs, fmtRate, fmtTime } from '../format';
import { usePoll } from '../poll';

const LIMIT = 100;
const CHART_N = 30;
const REFRESH_MS = 3000;

interface Row {
  e: LedgerEntry;
  prompt: number | null;
  cached: number | null;
  completion: number | null;
  reasoning: number | null;
  total: number | null;
}

const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);

/** The ledger keeps each dialect's own usage object; read the common figures out of any of them. */
function normalize(e: LedgerEntry): Row {
  const u = (e.usage ?? {}) as any;
  const anthropicCached = num(u.cache_read_input_tokens);
  const cached = num(u.prompt_tokens_details?.cached_tokens) ?? num(u.input_tokens_details?.cached_tokens) ?? anthropicCached;
  let prompt = num(u.prompt_tokens) ?? num(u.input_tokens);
  // Anthropic counts cache reads apart from input_tokens.
  if (u.prompt_tokens == null && anthropicCached != null && prompt != null) prompt += anthropicCached + (num(u.cache_creation_input_tokens) ?? 0);
  const completion = num(u.completion_tokens) ?? num(u.output_tokens);
  const reasoning = num(u.completion_tokens_details?.reasoning_tokens) ?? num(u.output_tokens_details?.reasoning_tokens);
  const total = num(u.total_tokens) ?? (prompt != null && completion != null ? prompt + completion : null);
  return { e, prompt, cached, completion, reasoning, total };
}

export function UsageView() {
  const poll = usePoll(() => usageLedger(LIMIT), REFRESH_MS);
  const rows = createMemo(() => (poll.data() ?? []).map(normalize));
  const totals = createMemo(() => {
    const r = rows();
    const rates = r.map((x) => x.e.decode_tokens_per_s).filter((v) => v > 0);
    return {
      requests: r.length,
      prompt: r.reduce((a, x) => a + (x.prompt ?? 0), 0),
      completion: r.reduce((a, x) => a + (x.completion ?? 0), 0),
      rate: rates.length ? rates.reduce((a, b) => a + b, 0) / rates.length : null,
    };
  });

  return (
    <div class="page" data-testid="usage-view">
      <div class="page-head">
        <h1>Usage</h1>
        <span class="muted">Every request this server answered, from any client, newest first.</span>
        <span class="spacer" />
        <span class="muted small" data-testid="usage-updated">
          {poll.updated() ? `updated ${fmtAgo(Date.now() - poll.updated()!)}` : 'loading…'}
        </span>
        <button class="btn small" data-testid="usage-refresh" onClick={() => void poll.refresh()}>
          Refresh
        </button>
      </div>
      <Show when={poll.error()}>
        <div class="banner error" role="alert" data-testid="usage-error">
          Cannot load the usage ledger: {poll.error()}
        </div>
      </Show>
      <div class="cards">
        <div class="card stat-card">
          <span class="muted">requests</span>
          <b data-testid="usage-count">{fmtInt(totals().requests)}</b>
        </div>
        <div class="card stat-card">
          <span class="muted">prompt tokens</span>
          <b>{fmtInt(totals().prompt)}</b>
        </div>
        <div class="card stat-card">
          <span class="muted">completion tokens</span>
          <b>{fmtInt(totals().completion)}</b>
        </div>
        <div class="card stat-card">
          <span class="muted">mean decode tok/s</span>
          <b>{fmtRate(totals().rate)}</b>
        </div>
      </div>
      <div class="card">
        <UsageChart rows={rows().slice(0, CHART_N).reverse()} />
      </div>
      <div class="table-wrap card">
        <table class="table" data-testid="usage-table">
          <thead>
            <tr>
              <th>time</th>
              <th>id</th>
              <th>dialect</th>
              <th>finish</th>
              <th class="num">prompt</th>
              <th class="num">cached</th>
              <th class="num">completion</th>
              <th class="num">reasoning</th>
              <th class="num">total</th>
              <th class="num">TTFT</th>
              <th class="num">tok/s</th>
            </tr>
          </thead>
          <tbody>
            <Show when={rows().length === 0 && poll.updated()}>
              <tr>
                <td colSpan={11} class="muted center" data-testid="usage-empty">
                  No requests yet.
                </td>
              </tr>
            </Show>
            <For each={rows()}>
              {(r) => (
                <tr data-testid="usage-row" data-id={r.e.id}>
                  <td>{fmtTime(r.e.created)}</td>
                  <td class="mono ellipsis" title={r.e.id}>
                    {r.e.id}
                  </td>
                  <td>
                    {r.e.dialect}
                    {r.e.stream ? ' · stream' : ''}
                  </td>
                  <td data-testid="usage-row-finish">{r.e.finish_reasons.join(', ')}</td>
                  <td class="num" data-testid="usage-row-prompt">{fmtInt(r.prompt)}</td>
                  <td class="num">{fmtInt(r.cached)}</td>
                  <td class="num" data-testid="usage-row-completion">{fmtInt(r.completion)}</td>
                  <td class="num">{fmtInt(r.reasoning)}</td>
                  <td class="num" data-testid="usage-row-total">{fmtInt(r.total)}</td>
                  <td class="num">{fmtMs(r.e.ttft_ms)}</td>
                  <td class="num">{fmtRate(r.e.decode_tokens_per_s)}</td>
                </tr>
              )}
            </For>
          </tbody>
        </table>
      </div>
    </div>
  );
}

/** Tokens per request (prompt + completion, stacked bars) and decode tok/s (line), oldest left. */
function UsageChart(props: { rows: Row[] }) {
  // Drawn at the figure's real pixel width so text and bars keep their size.
  const [W, setW] = createSignal(640);
  const H = 180;
  const pad = { l: 52, r: 64, t: 14, b: 22 };
  let fig!: HTMLElement;
  onMount(() => {
    const ro = new ResizeObserver(() => setW(Math.max(240, Math.round(fig.clientWidth))));
    ro.observe(fig);
    onCleanup(() => ro.disconnect());
  });
  const geo = createMemo(() => {
    const W_ = W();
    const rows = props.rows;
    const maxTok = Math.max(1, ...rows.map((r) => (r.prompt ?? 0) + (r.completion ?? 0)));
    const maxRate = Math.max(1, ...rows.map((r) => r.e.decode_tokens_per_s || 0));
    const n = Math.max(rows.length, 1);
    const slot = (W_ - pad.l - pad.r) / n;
    const bw = Math.max(2, Math.min(18, slot * 0.7));
    const y = (v: number) => pad.t + (H - pad.t - pad.b) * (1 - v / maxTok);
    const yr = (v: number) => pad.t + (H - pad.t - pad.b) * (1 - v / maxRate);
    const x = (i: number) => pad.l + slot * i + slot / 2;
    const bars = rows.map((r, i) => {
      const p = r.prompt ?? 0;
      const c = r.completion ?? 0;
      return {
        r,
        x: x(i) - bw / 2,
        w: bw,
        yPrompt: y(p),
        hPrompt: y(0) - y(p),
        yComp: y(p + c),
        hComp: y(p) - y(p + c),
      };
    });
    const pts = rows
      .map((r, i) => (r.e.decode_tokens_per_s > 0 ? `${x(i).toFixed(1)},${yr(r.e.decode_tokens_per_s).toFixed(1)}` : null))
      .filter(Boolean)
      .join(' ');
    return { maxTok, maxRate, bars, pts, base: y(0) };
  });
  return (
    <figure class="chart" data-testid="usage-chart" ref={fig}>
      <svg viewBox={`0 0 ${W()} ${H}`} width={W()} height={H} role="img" aria-label="Tokens and decode speed of recent requests">
        <line class="axis" x1={pad.l} x2={W() - pad.r} y1={geo().base} y2={geo().base} />
        <line class="grid" x1={pad.l} x2={W() - pad.r} y1={pad.t} y2={pad.t} />
        <text class="axis-label" x={pad.l - 6} y={pad.t + 4} text-anchor="end">
          {fmtInt(geo().maxTok)}
        </text>
        <text class="axis-label" x={pad.l - 6} y={pad.t + 16} text-anchor="end">
          tokens
        </text>
        <text class="axis-label" x={pad.l - 6} y={geo().base} text-anchor="end">
          0
        </text>
        <text class="axis-label rate" x={W() - pad.r + 6} y={pad.t + 4}>
          {fmtRate(geo().maxRate)} tok/s
        </text>
        <text class="axis-label" x={pad.l} y={H - 6}>
          older
        </text>
        <text class="axis-label" x={W() - pad.r} y={H - 6} text-anchor="end">
          newer
        </text>
        <For each={geo().bars}>
          {(b) => (
            <g data-testid="chart-bar">
              <title>
                {`${b.r.e.id}\nprompt ${fmtInt(b.r.prompt)} · completion ${fmtInt(b.r.completion)} · ${fmtRate(b.r.e.decode_tokens_per_s)} tok/s`}
              </title>
              <rect class="bar-prompt" x={b.x} y={b.yPrompt} width={b.w} height={Math.max(0, b.hPrompt)} />
              <rect class="bar-completion" x={b.x} y={b.yComp} width={b.w} height={Math.max(0, b.hComp)} />
            </g>
          )}
        </For>
        <Show when={geo().pts}>
          <polyline class="rate-line" points={geo().pts} />
        </Show>
      </svg>
      <figcaption class="legend">
        <span>
          <i class="swatch prompt" /> prompt tokens
        </span>
        <span>
          <i class="swatch completion" /> completion tokens
        </span>
        <span>
          <i class="swatch rate" /> decode tok/s (right scale)
        </span>
      </figcaption>
    </figure>
  );
}
