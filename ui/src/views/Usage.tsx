import { createMemo, createSignal, For, onCleanup, onMount, Show } from 'solid-js';
import {
  usageCsv,
  usageGroups,
  usageKeys,
  usagePage,
  dialects,
  usageSums,
  type KeyUse,
  type LedgerEntry,
  type UsageCost,
  type UsageFilters,
  type UsageGroup,
} from '../api';
import { fmtAgo, fmtCost, fmtInt, fmtMs, fmtRate, fmtShare, fmtTime } from '../format';
import { usePoll } from '../poll';

const LIMIT = 100;
const REFRESH_MS = 3000;
const SPANS: [string, string][] = [
  ['', 'all time'],
  ['1h', 'last hour'],
  ['today', 'today (UTC)'],
  ['24h', 'last 24 hours'],
  ['7d', 'last 7 days'],
  ['30d', 'last 30 days'],
];
const FINISHES = ['stop', 'length', 'stop_sequence', 'tool_calls', 'content_filter', 'cancelled', 'timeout', 'error'];

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
  // The ledger's own counts, the same for every dialect.
  const t = e.tokens;
  if (t) return { e, prompt: t.prompt, cached: t.cached, completion: t.completion, reasoning: t.reasoning, total: t.total };
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

/** The sums of several groups (the filter's totals are the sum of its days). */
function sum(groups: UsageGroup[]): UsageGroup {
  const t: UsageGroup = { key: 'all', requests: 0, prompt_tokens: 0, cached_tokens: 0, completion_tokens: 0, reasoning_tokens: 0, total_tokens: 0 };
  for (const g of groups) {
    t.requests += g.requests;
    t.prompt_tokens += g.prompt_tokens;
    t.cached_tokens += g.cached_tokens;
    t.completion_tokens += g.completion_tokens;
    t.reasoning_tokens += g.reasoning_tokens;
    t.total_tokens += g.total_tokens;
  }
  return t;
}

interface Loaded {
  rows: Row[];
  hasMore: boolean;
  nextCursor: number | null;
  days: UsageGroup[];
  models: UsageGroup[];
  clients: UsageGroup[];
  keys: KeyUse[];
  /** What the filter's traffic would have cost at the server's prices; absent when it has none. */
  cost?: UsageCost;
  /** Models in the filter without a price (their tokens add nothing to the cost). */
  unpriced: string[];
}

export function UsageView() {
  const [filters, setFilters] = createSignal<UsageFilters>({});
  const [older, setOlder] = createSignal<Row[]>([]);
  const [olderCursor, setOlderCursor] = createSignal<number | null>(null);
  const [exporting, setExporting] = createSignal(false);
  const [exportError, setExportError] = createSignal<string | null>(null);
  // The dialects this server speaks, as it names them in the ledger.
  const [dialectNames, setDialectNames] = createSignal<string[]>([]);
  onMount(() => void dialects().then(setDialectNames).catch(() => setDialectNames([])));
  const load = async (): Promise<Loaded> => {
    const f = filters();
    const [page, days, models, clients, keys] = await Promise.all([
      usagePage(f, LIMIT),
      usageSums(f, 'day'),
      usageGroups(f, 'model'),
      usageGroups(f, 'client'),
      usageKeys().catch(() => [] as KeyUse[]),
    ]);
    return {
      rows: page.data.map(normalize),
      hasMore: page.has_more,
      nextCursor: page.next_cursor,
      days: days.data,
      models,
      clients,
      keys,
      cost: days.cost,
      unpriced: days.unpriced_models ?? [],
    };
  };
  const poll = usePoll(load, REFRESH_MS);
  const setFilter = (k: keyof UsageFilters, v: string) => {
    setFilters({ ...filters(), [k]: v || undefined });
    setOlder([]);
    setOlderCursor(null);
    void poll.refresh();
  };
  const rows = createMemo(() => [...(poll.data()?.rows ?? []), ...older()]);
  const totals = createMemo(() => sum(poll.data()?.days ?? []));
  const cost = () => poll.data()?.cost;
  const cursor = () => (older().length ? olderCursor() : (poll.data()?.nextCursor ?? null));
  const loadMore = async () => {
    const c = cursor();
    if (c == null) return;
    const page = await usagePage(filters(), LIMIT, c);
    setOlder([...older(), ...page.data.map(normalize)]);
    setOlderCursor(page.has_more ? page.next_cursor : null);
  };
  const exportCsv = async () => {
    setExporting(true);
    setExportError(null);
    try {
      const text = await usageCsv(filters());
      const url = URL.createObjectURL(new Blob([text], { type: 'text/csv' }));
      const a = document.createElement('a');
      a.href = url;
      a.download = 'shoal-usage.csv';
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (e) {
      setExportError((e as Error).message);
    } finally {
      setExporting(false);
    }
  };
  const select = (k: keyof UsageFilters, label: string, options: [string, string][]) => (
    <label class="filter">
      <span class="muted small">{label}</span>
      <select data-testid={`usage-filter-${k}`} value={filters()[k] ?? ''} onChange={(e) => setFilter(k, e.currentTarget.value)}>
        <For each={options}>{([v, text]) => <option value={v}>{text}</option>}</For>
      </select>
    </label>
  );
  const named = (groups: UsageGroup[] | undefined, all: string): [string, string][] => [
    ['', all],
    ...(groups ?? []).filter((g) => g.key).map((g): [string, string] => [g.key, g.key]),
  ];

  return (
    <div class="page" data-testid="usage-view">
      <div class="page-head">
        <h1>Usage</h1>
        <span class="muted">Every request this server answered, from any client, kept in its ledger.</span>
        <span class="spacer" />
        <span class="muted small" data-testid="usage-updated">
          {poll.updated() ? `updated ${fmtAgo(Date.now() - poll.updated()!)}` : 'loading…'}
        </span>
        <button class="btn small" data-testid="usage-refresh" onClick={() => void poll.refresh()}>
          Refresh
        </button>
        <button class="btn small" data-testid="usage-export" disabled={exporting()} onClick={() => void exportCsv()}>
          Export CSV
        </button>
      </div>
      <div class="filters" data-testid="usage-filters">
        {select('scope', 'scope', [
          ['', 'this server'],
          ['cluster', 'whole cluster'],
        ])}
        {select('since', 'time', SPANS)}
        {select('model', 'model', named(poll.data()?.models, 'any model'))}
        {select('client', 'client (API key)', named(poll.data()?.clients, 'any client'))}
        {select('dialect', 'dialect', [['', 'any dialect'], ...dialectNames().map((d): [string, string] => [d, d])])}
        {select('finish', 'finish', [['', 'any finish'], ...FINISHES.map((d): [string, string] => [d, d])])}
      </div>
      <Show when={poll.error() || exportError()}>
        <div class="banner error" role="alert" data-testid="usage-error">
          {poll.error() ? `Cannot load the usage ledger: ${poll.error()}` : `Cannot export: ${exportError()}`}
        </div>
      </Show>
      <div class="cards">
        <StatCard label="requests" testid="usage-count" value={fmtInt(totals().requests)} />
        <StatCard label="prompt tokens" testid="usage-total-prompt" value={fmtInt(totals().prompt_tokens)} />
        <ShareCard label="cache hit" testid="usage-cache-hit" part={totals().cached_tokens} whole={totals().prompt_tokens} noun="cached"
          title="Cached ÷ prompt tokens: the share of prompts the prefix cache served" />
        <StatCard label="completion tokens" testid="usage-total-completion" value={fmtInt(totals().completion_tokens)} />
        <ShareCard label="reasoning share" testid="usage-reasoning-share" part={totals().reasoning_tokens} whole={totals().completion_tokens}
          noun="reasoning" title="Reasoning ÷ completion tokens" />
        <Show when={cost()}>
          {(c) => (
            <div
              class="card stat-card"
              data-testid="usage-cost-card"
              title={`What this traffic would have cost at the server's prices ([prices.MODEL]): input ${fmtCost(c().input)}, cached input ${fmtCost(c().cached_input)}, output ${fmtCost(c().output)}`}
            >
              <span class="muted">cost at your prices</span>
              <b data-testid="usage-cost" data-value={c().total}>
                {fmtCost(c().total)}
              </b>
              <span class="muted small" data-testid="usage-unpriced">
                {poll.data()!.unpriced.length ? `no price: ${poll.data()!.unpriced.join(', ')}` : 'every model priced'}
              </span>
            </div>
          )}
        </Show>
      </div>
      <div class="card">
        <DayChart days={poll.data()?.days ?? []} />
      </div>
      {/* With a cost column the group tables need the whole width. */}
      <div class="split" classList={{ stacked: !!cost() }}>
        <GroupTable title="Per model" testid="usage-by-model" groups={poll.data()?.models ?? []} />
        <GroupTable title="Per client" testid="usage-by-client" groups={poll.data()?.clients ?? []} />
      </div>
      <Show when={(poll.data()?.keys ?? []).length > 0}>
        <KeyTable keys={poll.data()!.keys} />
      </Show>
      <div class="table-wrap card">
        <table class="table" data-testid="usage-table">
          <thead>
            <tr>
              <th>time</th>
              <th>id</th>
              <th>dialect</th>
              <th>client</th>
              <th>status</th>
              <th>finish</th>
              <th class="num">prompt</th>
              <th class="num">cached</th>
              <th class="num">completion</th>
              <th class="num">reasoning</th>
              <th class="num">total</th>
              <Show when={cost()}>
                <th class="num">cost</th>
              </Show>
              <th class="num">TTFT</th>
              <th class="num">tok/s</th>
            </tr>
          </thead>
          <tbody>
            <Show when={rows().length === 0 && poll.updated()}>
              <tr>
                <td colSpan={cost() ? 14 : 13} class="muted center" data-testid="usage-empty">
                  No requests {Object.values(filters()).some(Boolean) ? 'match these filters' : 'yet'}.
                </td>
              </tr>
            </Show>
            <For each={rows()}>
              {(r) => (
                <tr data-testid="usage-row" data-id={r.e.id} title={r.e.error ?? undefined}>
                  <td>{fmtTime(r.e.created)}</td>
                  <td class="mono ellipsis" title={r.e.id}>
                    {r.e.id}
                  </td>
                  <td>
                    {r.e.dialect}
                    {r.e.stream ? ' · stream' : ''}
                  </td>
                  <td data-testid="usage-row-client">{r.e.client ?? '–'}</td>
                  <td data-testid="usage-row-status">{r.e.status ?? ''}</td>
                  <td data-testid="usage-row-finish">{r.e.finish_reasons.length ? r.e.finish_reasons.join(', ') : (r.e.engine_finish_reasons ?? []).join(', ') || 'error'}</td>
                  <td class="num" data-testid="usage-row-prompt">{fmtInt(r.prompt)}</td>
                  <td class="num">{fmtInt(r.cached)}</td>
                  <td class="num" data-testid="usage-row-completion">{fmtInt(r.completion)}</td>
                  <td class="num">{fmtInt(r.reasoning)}</td>
                  <td class="num" data-testid="usage-row-total">{fmtInt(r.total)}</td>
                  <Show when={cost()}>
                    <td class="num" data-testid="usage-row-cost" data-value={r.e.cost?.total ?? ''}>
                      {r.e.cost ? fmtCost(r.e.cost.total) : '–'}
                    </td>
                  </Show>
                  <td class="num">{fmtMs(r.e.ttft_ms)}</td>
                  <td class="num">{fmtRate(r.e.decode_tokens_per_s)}</td>
                </tr>
              )}
            </For>
          </tbody>
        </table>
        <Show when={cursor() != null}>
          <button class="btn small" data-testid="usage-more" onClick={() => void loadMore()}>
            Older requests
          </button>
        </Show>
      </div>
    </div>
  );
}

/** Sums per group: requests, tokens, cache-hit % and reasoning share; the cost when the server has prices. */
/** One figure of the totals row, with an optional line beneath it. */
function StatCard(props: { label: string; testid: string; value: string; note?: string; title?: string }) {
  return (
    <div class="card stat-card" title={props.title}>
      <span class="muted">{props.label}</span>
      <b data-testid={props.testid}>{props.value}</b>
      <Show when={props.note}>
        <span class="muted small">{props.note}</span>
      </Show>
    </div>
  );
}

/** A share of one total in another, with the part's count beneath. */
function ShareCard(props: { label: string; testid: string; part: number; whole: number; noun: string; title: string }) {
  return (
    <StatCard
      label={props.label}
      testid={props.testid}
      value={fmtShare(props.part, props.whole)}
      note={`${fmtInt(props.part)} ${props.noun}`}
      title={props.title}
    />
  );
}

function GroupTable(props: { title: string; testid: string; groups: UsageGroup[] }) {
  const priced = () => props.groups.some((g) => g.cost);
  return (
    <div class="table-wrap card">
      <h2 class="small-head">{props.title}</h2>
      <table class="table" data-testid={props.testid}>
        <thead>
          <tr>
            <th />
            <th class="num">requests</th>
            <th class="num">prompt</th>
            <th class="num">cache hit</th>
            <th class="num">completion</th>
            <th class="num">reasoning</th>
            <th class="num">total</th>
            <Show when={priced()}>
              <th class="num">cost</th>
            </Show>
          </tr>
        </thead>
        <tbody>
          <For each={props.groups}>
            {(g) => (
              <tr data-testid="group-row" data-key={g.key}>
                <td>{g.key || '–'}</td>
                <td class="num" data-testid="group-requests">{fmtInt(g.requests)}</td>
                <td class="num" data-testid="group-prompt">{fmtInt(g.prompt_tokens)}</td>
                <td class="num">{fmtShare(g.cached_tokens, g.prompt_tokens)}</td>
                <td class="num" data-testid="group-completion">{fmtInt(g.completion_tokens)}</td>
                <td class="num">{fmtShare(g.reasoning_tokens, g.completion_tokens)}</td>
                <td class="num" data-testid="group-total">{fmtInt(g.total_tokens)}</td>
                <Show when={priced()}>
                  <td class="num" data-testid="group-cost" data-value={g.cost?.total ?? ''}>
                    {fmtCost(g.cost?.total)}
                  </td>
                </Show>
              </tr>
            )}
          </For>
        </tbody>
      </table>
    </div>
  );
}

/** Each API key's tokens today against its daily quota, and requests this minute. */
function KeyTable(props: { keys: KeyUse[] }) {
  return (
    <div class="table-wrap card">
      <h2 class="small-head">API keys</h2>
      <table class="table" data-testid="usage-keys">
        <thead>
          <tr>
            <th>key</th>
            <th class="num">tokens today</th>
            <th class="num">daily quota</th>
            <th>used</th>
            <th class="num">requests this minute</th>
          </tr>
        </thead>
        <tbody>
          <For each={props.keys}>
            {(k) => (
              <tr data-testid="key-row" data-key={k.name}>
                <td>{k.name}</td>
                <td class="num">{fmtInt(k.tokens_today)}</td>
                <td class="num">{k.tokens_per_day == null ? 'none' : fmtInt(k.tokens_per_day)}</td>
                <td>
                  <Show when={k.tokens_per_day != null} fallback="–">
                    <meter min={0} max={k.tokens_per_day!} value={Math.min(k.tokens_today, k.tokens_per_day!)} /> {fmtShare(k.tokens_today, k.tokens_per_day)}
                  </Show>
                </td>
                <td class="num">
                  {fmtInt(k.requests_last_minute)}
                  {k.requests_per_minute == null ? '' : ` / ${k.requests_per_minute}`}
                </td>
              </tr>
            )}
          </For>
        </tbody>
      </table>
    </div>
  );
}

/** Tokens per UTC day: uncached prompt, cached prompt and completion, stacked. */
function DayChart(props: { days: UsageGroup[] }) {
  // Drawn at the figure's real pixel width so text and bars keep their size.
  const [W, setW] = createSignal(640);
  const H = 180;
  const pad = { l: 52, r: 16, t: 14, b: 22 };
  let fig!: HTMLElement;
  onMount(() => {
    const ro = new ResizeObserver(() => setW(Math.max(240, Math.round(fig.clientWidth))));
    ro.observe(fig);
    onCleanup(() => ro.disconnect());
  });
  const geo = createMemo(() => {
    const W_ = W();
    const days = props.days;
    const maxTok = Math.max(1, ...days.map((d) => d.total_tokens));
    const n = Math.max(days.length, 1);
    const slot = (W_ - pad.l - pad.r) / n;
    const bw = Math.max(4, Math.min(40, slot * 0.7));
    const y = (v: number) => pad.t + (H - pad.t - pad.b) * (1 - v / maxTok);
    const bars = days.map((d, i) => {
      const x = pad.l + slot * i + slot / 2 - bw / 2;
      const fresh = d.prompt_tokens - d.cached_tokens;
      const segs = [
        { cls: 'bar-prompt', from: 0, to: fresh },
        { cls: 'bar-cached', from: fresh, to: d.prompt_tokens },
        { cls: 'bar-completion', from: d.prompt_tokens, to: d.total_tokens },
      ].map((s) => ({ cls: s.cls, y: y(s.to), h: Math.max(0, y(s.from) - y(s.to)) }));
      return { d, x, w: bw, segs, labelX: x + bw / 2 };
    });
    return { maxTok, bars, base: y(0) };
  });
  return (
    <figure class="chart" data-testid="usage-chart" ref={fig}>
      <svg viewBox={`0 0 ${W()} ${H}`} width={W()} height={H} role="img" aria-label="Tokens per day">
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
        <For each={geo().bars}>
          {(b) => (
            <g data-testid="chart-bar" data-day={b.d.key} data-total={b.d.total_tokens}>
              <title>
                {`${b.d.key}: ${fmtInt(b.d.requests)} requests · prompt ${fmtInt(b.d.prompt_tokens)} (${fmtShare(b.d.cached_tokens, b.d.prompt_tokens)} cached) · completion ${fmtInt(b.d.completion_tokens)}`}
              </title>
              <For each={b.segs}>{(s) => <rect class={s.cls} x={b.x} y={s.y} width={b.w} height={s.h} />}</For>
              <text class="axis-label" x={b.labelX} y={H - 6} text-anchor="middle">
                {b.d.key.slice(5)}
              </text>
            </g>
          )}
        </For>
      </svg>
      <figcaption class="legend">
        <span>
          <i class="swatch prompt" /> prompt tokens
        </span>
        <span>
          <i class="swatch cached" /> cached prompt tokens
        </span>
        <span>
          <i class="swatch completion" /> completion tokens
        </span>
      </figcaption>
    </figure>
  );
}
