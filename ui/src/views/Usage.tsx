import { createMemo, createSignal, For, onCleanup, onMount, Show } from 'solid-js';
import {
  usageCsv,
  usageGroups,
  usageKeys,
  usagePage,
  dialects,
  usageSums,
  type GroupBy,
  type KeyUse,
  type LedgerEntry,
  type UsageCost,
  type UsageFilters,
  type UsageGroup,
} from '../api';
import { fmtAgo, fmtCost, fmtDateTime, fmtInt, fmtMs, fmtRate, fmtShare } from '../format';
import { usePoll } from '../poll';

const LIMIT = 100;
const REFRESH_MS = 3000;
const HOUR = 3600;
const DAY = 86_400;
const SPANS: [string, string][] = [
  ['', 'all time'],
  ['1h', 'last hour'],
  ['today', 'today (UTC)'],
  ['24h', 'last 24 hours'],
  ['7d', 'last 7 days'],
  ['30d', 'last 30 days'],
];
/** Where each time filter starts, in Unix seconds (all time: none). */
const SPAN_START: Record<string, (now: number) => number> = {
  '1h': (now) => now - HOUR,
  today: (now) => now - (now % DAY),
  '24h': (now) => now - DAY,
  '7d': (now) => now - 7 * DAY,
  '30d': (now) => now - 30 * DAY,
};
/** Ranges up to this long are charted per hour, longer ones per day. */
const HOURLY_UP_TO = 2 * DAY;
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

type Unit = 'hour' | 'day' | 'week';

/** The Monday (UTC) a week starts on, in Unix seconds; 1970-01-01 was a Thursday. */
const mondayOf = (secs: number) => {
  const day = Math.floor(secs / DAY);
  return Math.max(0, day - ((day + 3) % 7)) * DAY;
};
/** The server's bucket key (`YYYY-MM-DD`, `YYYY-MM-DDTHH`, a week's Monday; UTC) of Unix seconds, and back. */
const keyOf = (secs: number, unit: Unit) =>
  new Date((unit === 'week' ? mondayOf(secs) : secs) * 1000).toISOString().slice(0, unit === 'hour' ? 13 : 10);
const startOf = (key: string) => Date.parse(key.length > 10 ? `${key}:00:00Z` : `${key}T00:00:00Z`) / 1000;

/** Every bucket from `from` to `now`, the empty ones as zero sums, so the chart shows the whole range. */
function fill(sums: UsageGroup[], unit: Unit, from: number, now: number): UsageGroup[] {
  const step = unit === 'hour' ? HOUR : unit === 'day' ? DAY : 7 * DAY;
  const byKey = new Map(sums.map((g) => [g.key, g]));
  const first = unit === 'week' ? mondayOf(from) : from - (from % step);
  for (let t = first; t <= now; t += step) {
    const key = keyOf(t, unit);
    if (!byKey.has(key)) byKey.set(key, { ...sum([]), key });
  }
  return [...byKey.values()].sort((a, b) => a.key.localeCompare(b.key));
}

/** The sums of several groups (the filter's totals are the sum of its buckets). */
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
  /** The chart's buckets over the whole range, empty ones included. */
  buckets: UsageGroup[];
  unit: Unit;
  models: UsageGroup[];
  clients: UsageGroup[];
  /** The sums by the group the reader chose. */
  chosen: UsageGroup[];
  keys: KeyUse[];
  /** What the filter's traffic would have cost at the server's prices; absent when it has none. */
  cost?: UsageCost;
  /** Models in the filter without a price (their tokens add nothing to the cost). */
  unpriced: string[];
}

/** What the chart's bars may stand for; `auto` picks hours for ranges up to two days, else days. */
const BUCKETS: [string, string][] = [
  ['auto', 'auto'],
  ['hour', 'per hour'],
  ['day', 'per day'],
  ['week', 'per week'],
];
/** The groups a third table can sum by, beside the fixed per-model and per-client ones. */
const GROUP_BYS: [GroupBy, string][] = [
  ['dialect', 'dialect'],
  ['finish', 'finish'],
  ['node', 'node'],
  ['model', 'model'],
  ['client', 'client'],
];

export function UsageView() {
  // `/usage?turn=…` (a reply's "ledger rows" link) opens on that chat turn's requests.
  const turn = new URLSearchParams(location.search).get('turn');
  const [filters, setFilters] = createSignal<UsageFilters>(turn ? { turn } : {});
  const [bucket, setBucket] = createSignal<string>('auto');
  const [groupBy, setGroupBy] = createSignal<GroupBy>('dialect');
  const [older, setOlder] = createSignal<Row[]>([]);
  const [olderCursor, setOlderCursor] = createSignal<number | null>(null);
  const [exporting, setExporting] = createSignal(false);
  const [exportError, setExportError] = createSignal<string | null>(null);
  // The dialects this server speaks, as it names them in the ledger.
  const [dialectNames, setDialectNames] = createSignal<string[]>([]);
  onMount(() => void dialects().then(setDialectNames).catch(() => setDialectNames([])));
  const load = async (): Promise<Loaded> => {
    const f = filters();
    const now = Math.floor(Date.now() / 1000);
    const spanStart = f.since ? SPAN_START[f.since]?.(now) : undefined;
    const asked = bucket();
    const by = groupBy();
    let unit: Unit = asked !== 'auto' ? (asked as Unit) : spanStart != null && now - spanStart <= HOURLY_UP_TO ? 'hour' : 'day';
    const [page, first, models, clients, chosen, keys] = await Promise.all([
      usagePage(f, LIMIT),
      usageSums(f, unit),
      usageGroups(f, 'model'),
      usageGroups(f, 'client'),
      usageGroups(f, by),
      usageKeys().catch(() => [] as KeyUse[]),
    ]);
    let sums = first;
    // All time runs from the first request: if that is under two days ago, chart it per hour.
    if (asked === 'auto' && spanStart == null && sums.data.length && now - startOf(sums.data[0].key) <= HOURLY_UP_TO) {
      unit = 'hour';
      sums = await usageSums(f, unit);
    }
    return {
      rows: page.data.map(normalize),
      hasMore: page.has_more,
      nextCursor: page.next_cursor,
      buckets: sums.data.length ? fill(sums.data, unit, spanStart ?? startOf(sums.data[0].key), now) : [],
      unit,
      models,
      clients,
      chosen,
      keys,
      cost: sums.cost,
      unpriced: sums.unpriced_models ?? [],
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
  const totals = createMemo(() => sum(poll.data()?.buckets ?? []));
  // What an empty table or chart says: why it is empty, then what would be there.
  const none = () => {
    const { since, scope, ...rest } = filters();
    return Object.values(rest).some(Boolean) ? 'No requests match these filters' : since ? 'No requests in this range' : 'No requests yet';
  };
  const loaded = () => poll.updated() != null;
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
    <div class="page usage" data-testid="usage-view">
      <div class="page-head">
        <h1>Usage</h1>
        <span class="muted" data-testid="usage-subtitle">
          {filters().scope === 'cluster'
            ? "Every request the cluster's nodes answered, from any client, merged from each online node's ledger."
            : 'Every request this server answered, from any client, kept in its ledger.'}
        </span>
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
        <Show when={filters().turn}>
          {(t) => (
            <span class="filter turn-filter" data-testid="usage-filter-turn" title={t()}>
              <span class="muted small">one chat turn</span>
              <button
                class="btn small"
                data-testid="usage-filter-turn-clear"
                onClick={() => {
                  history.replaceState(null, '', '/usage');
                  setFilter('turn', '');
                }}
              >
                All requests ✕
              </button>
            </span>
          )}
        </Show>
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
        <label class="chart-bucket">
          <span class="muted small">bars</span>
          <select
            data-testid="usage-bucket"
            value={bucket()}
            onChange={(e) => {
              setBucket(e.currentTarget.value);
              void poll.refresh();
            }}
          >
            <For each={BUCKETS}>{([v, label]) => <option value={v}>{label}</option>}</For>
          </select>
        </label>
        <Show when={poll.data()}>
          {(d) => (
            <Show
              when={totals().total_tokens > 0}
              fallback={
                <p class="muted usage-empty" data-testid="usage-chart-empty">
                  {/* Refused requests count no tokens. */}
                  {totals().requests ? 'No tokens in this range' : none()} — each {d().unit}'s prompt, cached and completion tokens are charted
                  here.
                </p>
              }
            >
              <BucketChart buckets={d().buckets} unit={d().unit} />
            </Show>
          )}
        </Show>
      </div>
      {/* With a cost column the group tables need the whole width. */}
      <div class="split" classList={{ stacked: !!cost() }}>
        <GroupTable
          title="Per model"
          testid="usage-by-model"
          groups={poll.data()?.models ?? []}
          loaded={loaded()}
          all="all models"
          unnamed="refused before a model was chosen"
          empty={`${none()} — each model's requests and tokens appear here.`}
        />
        <GroupTable
          title="Per client"
          testid="usage-by-client"
          groups={poll.data()?.clients ?? []}
          loaded={loaded()}
          all="all clients"
          unnamed="no API key"
          empty={`${none()} — each API key's requests and tokens appear here.`}
        />
      </div>
      <div class="group-pick">
        <label>
          <span class="muted small">Per</span>
          <select
            data-testid="usage-group-by"
            value={groupBy()}
            onChange={(e) => {
              setGroupBy(e.currentTarget.value as GroupBy);
              void poll.refresh();
            }}
          >
            <For each={GROUP_BYS}>{([v, label]) => <option value={v}>{label}</option>}</For>
          </select>
        </label>
        <GroupTable
          title={`Per ${groupBy()}`}
          testid="usage-by-chosen"
          groups={poll.data()?.chosen ?? []}
          loaded={loaded()}
          all={`all ${groupBy()}s`}
          unnamed="none recorded"
          empty={`${none()} — each ${groupBy()}'s requests and tokens appear here.`}
        />
      </div>
      <Show when={(poll.data()?.keys ?? []).length > 0}>
        <KeyTable keys={poll.data()!.keys} />
      </Show>
      {/* Its own scroll box, at most a window tall, its header kept in sight while its rows scroll. */}
      <div class="table-wrap card usage-log" data-testid="usage-log">
        <table class="table card-rows usage-table" data-testid="usage-table">
          <thead>
            <tr>
              <th>time</th>
              <th>model</th>
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
            <Show when={rows().length === 0 && loaded()}>
              <tr>
                <td colSpan={cost() ? 14 : 13} class="muted usage-empty" data-testid="usage-empty">
                  {none()} — requests to any API appear here with their tokens.
                </td>
              </tr>
            </Show>
            <For each={rows()}>
              {(r) => (
                // The request's id (long, for support and `shoal usage`) is the row's hover, not a column.
                <tr
                  data-testid="usage-row"
                  data-id={r.e.id}
                  title={r.e.error ? `${r.e.id}: ${r.e.error}` : r.e.id}
                >
                  <td class="nowrap" data-testid="usage-row-time">
                    {fmtDateTime(r.e.created)}
                  </td>
                  <td class="ellipsis row-head" data-testid="usage-row-model" classList={{ muted: !r.e.model }}>
                    {r.e.model || 'no model'}
                  </td>
                  <td data-label="dialect">
                    {r.e.dialect}
                    {r.e.stream ? ' · stream' : ''}
                  </td>
                  <td data-label="client" data-testid="usage-row-client" classList={{ muted: !r.e.client }}>
                    {r.e.client || 'no API key'}
                  </td>
                  <td data-label="status" data-testid="usage-row-status">{r.e.status ?? ''}</td>
                  <td data-label="finish" data-testid="usage-row-finish">{r.e.finish_reasons.length ? r.e.finish_reasons.join(', ') : (r.e.engine_finish_reasons ?? []).join(', ') || 'error'}</td>
                  <td class="num" data-label="prompt" data-testid="usage-row-prompt">{fmtInt(r.prompt)}</td>
                  <td class="num" data-label="cached">{fmtInt(r.cached)}</td>
                  <td class="num" data-label="completion" data-testid="usage-row-completion">{fmtInt(r.completion)}</td>
                  <td class="num" data-label="reasoning">{fmtInt(r.reasoning)}</td>
                  <td class="num" data-label="total" data-testid="usage-row-total">{fmtInt(r.total)}</td>
                  <Show when={cost()}>
                    <td class="num" data-label="cost" data-testid="usage-row-cost" data-value={r.e.cost?.total ?? ''}>
                      {r.e.cost ? fmtCost(r.e.cost.total) : '–'}
                    </td>
                  </Show>
                  <td class="num" data-label="TTFT">{fmtMs(r.e.ttft_ms)}</td>
                  <td class="num" data-label="tok/s">{fmtRate(r.e.decode_tokens_per_s)}</td>
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

function GroupTable(props: {
  title: string;
  testid: string;
  groups: UsageGroup[];
  loaded: boolean;
  /** The total row's label. */
  all: string;
  /** What the group without a key is. */
  unnamed: string;
  /** What the table says when it has no rows. */
  empty: string;
}) {
  const priced = () => props.groups.some((g) => g.cost);
  const total = createMemo(() => ({ ...sum(props.groups), key: props.all }));
  // The total cost counts only the groups that have a price.
  const totalCost = () => props.groups.reduce((a, g) => a + (g.cost?.total ?? 0), 0);
  const cells = (g: UsageGroup, cost: number | undefined) => (
    <>
      <td class="num" data-testid="group-requests">{fmtInt(g.requests)}</td>
      <td class="num" data-testid="group-prompt">{fmtInt(g.prompt_tokens)}</td>
      <td class="num">{fmtShare(g.cached_tokens, g.prompt_tokens)}</td>
      <td class="num" data-testid="group-completion">{fmtInt(g.completion_tokens)}</td>
      <td class="num">{fmtShare(g.reasoning_tokens, g.completion_tokens)}</td>
      <td class="num" data-testid="group-total">{fmtInt(g.total_tokens)}</td>
      <Show when={priced()}>
        <td class="num" data-testid="group-cost" data-value={cost ?? ''}>
          {fmtCost(cost)}
        </td>
      </Show>
    </>
  );
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
          <Show when={props.groups.length === 0 && props.loaded}>
            <tr>
              <td colSpan={priced() ? 8 : 7} class="muted usage-empty" data-testid="group-empty">
                {props.empty}
              </td>
            </tr>
          </Show>
          <For each={props.groups}>
            {(g) => (
              <tr data-testid="group-row" data-key={g.key}>
                <td class="group-key" classList={{ muted: !g.key }} title={g.key || props.unnamed}>
                  {g.key || props.unnamed}
                </td>
                {cells(g, g.cost?.total)}
              </tr>
            )}
          </For>
        </tbody>
        {/* One group's total would only repeat it. */}
        <Show when={props.groups.length > 1}>
          <tfoot>
            <tr data-testid="group-total-row">
              <th class="group-key">{props.all}</th>
              {cells(total(), totalCost())}
            </tr>
          </tfoot>
        </Show>
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

/** A round number at least `n` (1, 2 or 5 times a power of ten), for the chart's top line. */
function niceCeil(n: number): number {
  const p = 10 ** Math.floor(Math.log10(n));
  return [1, 2, 5, 10].map((m) => m * p).find((v) => v >= n)!;
}

/** Tokens per UTC hour or day: uncached prompt, cached prompt and completion, stacked; empty buckets keep their slot. */
function BucketChart(props: { buckets: UsageGroup[]; unit: Unit }) {
  // Drawn at the figure's real pixel width so text and bars keep their size.
  const [W, setW] = createSignal(640);
  const H = 180;
  const pad = { l: 64, r: 16, t: 14, b: 22 };
  let fig!: HTMLElement;
  onMount(() => {
    const ro = new ResizeObserver(() => setW(Math.max(240, Math.round(fig.clientWidth))));
    ro.observe(fig);
    onCleanup(() => ro.disconnect());
  });
  const geo = createMemo(() => {
    const W_ = W();
    const buckets = props.buckets;
    const maxTok = niceCeil(Math.max(1, ...buckets.map((d) => d.total_tokens)));
    const n = Math.max(buckets.length, 1);
    const slot = (W_ - pad.l - pad.r) / n;
    const bw = Math.max(1, Math.min(40, slot * 0.7));
    // Label every k-th bucket so the labels (about 40 px) never overlap.
    const every = Math.ceil(44 / slot);
    const y = (v: number) => pad.t + (H - pad.t - pad.b) * (1 - v / maxTok);
    const bars = buckets.map((d, i) => {
      const x = pad.l + slot * i + slot / 2 - bw / 2;
      const fresh = d.prompt_tokens - d.cached_tokens;
      const segs = [
        { cls: 'bar-prompt', from: 0, to: fresh },
        { cls: 'bar-cached', from: fresh, to: d.prompt_tokens },
        { cls: 'bar-completion', from: d.prompt_tokens, to: d.total_tokens },
      ].map((s) => ({ cls: s.cls, y: y(s.to), h: Math.max(0, y(s.from) - y(s.to)) }));
      const label = (n - 1 - i) % every === 0 ? (props.unit === 'hour' ? `${d.key.slice(11)}:00` : d.key.slice(5)) : '';
      return { d, x, w: bw, segs, labelX: x + bw / 2, label };
    });
    return { maxTok, bars, base: y(0), mid: y(maxTok / 2) };
  });
  const what = () => props.unit;
  return (
    <figure class="chart" data-testid="usage-chart" data-unit={props.unit} ref={fig}>
      <svg viewBox={`0 0 ${W()} ${H}`} width={W()} height={H} role="img" aria-label={`Tokens per UTC ${what()}`}>
        <line class="axis" x1={pad.l} x2={W() - pad.r} y1={geo().base} y2={geo().base} />
        <line class="grid" x1={pad.l} x2={W() - pad.r} y1={pad.t} y2={pad.t} />
        <line class="grid" x1={pad.l} x2={W() - pad.r} y1={geo().mid} y2={geo().mid} />
        <text class="axis-label" x={pad.l - 6} y={pad.t + 4} text-anchor="end">
          {fmtInt(geo().maxTok)}
        </text>
        <text class="axis-label" x={pad.l - 6} y={pad.t + 16} text-anchor="end">
          tokens
        </text>
        <Show when={geo().maxTok >= 2}>
          <text class="axis-label" x={pad.l - 6} y={geo().mid + 4} text-anchor="end">
            {fmtInt(geo().maxTok / 2)}
          </text>
        </Show>
        <text class="axis-label" x={pad.l - 6} y={geo().base} text-anchor="end">
          0
        </text>
        <For each={geo().bars}>
          {(b) => (
            <g data-testid="chart-bar" data-key={b.d.key} data-total={b.d.total_tokens}>
              <title>
                {`${b.d.key}${props.unit === 'hour' ? ':00 UTC' : ''}: ${fmtInt(b.d.requests)} requests · prompt ${fmtInt(b.d.prompt_tokens)} (${fmtShare(b.d.cached_tokens, b.d.prompt_tokens)} cached) · completion ${fmtInt(b.d.completion_tokens)}`}
              </title>
              {/* An empty bucket is a tick on the axis, so its slot reads as "none" rather than missing. */}
              <Show when={b.d.total_tokens > 0} fallback={<rect class="bar-empty" x={b.x} y={geo().base - 1} width={b.w} height={1} />}>
                <For each={b.segs}>{(s) => <rect class={s.cls} x={b.x} y={s.y} width={b.w} height={s.h} />}</For>
              </Show>
              <text class="axis-label" x={b.labelX} y={H - 6} text-anchor="middle">
                {b.label}
              </text>
            </g>
          )}
        </For>
      </svg>
      <figcaption class="legend">
        <span>tokens per UTC {what()}:</span>
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
