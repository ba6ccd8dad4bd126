import { For, Show } from 'solid-js';
import { clusterNodes, usageGroups, type ClusterNode, type UsageGroup } from '../api';
import { backendName, fmtAgo, fmtBytes, fmtInt, fmtShare } from '../format';
import { usePoll } from '../poll';

const REFRESH_MS = 2000;

export function ClusterView() {
  const poll = usePoll(clusterNodes, REFRESH_MS);
  // Tokens each node served, from every node's ledger (a request counts
  // for the node that ran it).
  const served = usePoll(() => usageGroups({ scope: 'cluster' }, 'served_by'), REFRESH_MS);
  return (
    <div class="page" data-testid="cluster-view">
      <div class="page-head">
        <h1>Cluster</h1>
        <span class="muted">Nodes serving models, refreshed every 2 s.</span>
      </div>
      <Show when={poll.error()}>
        <div class="banner error" role="alert" data-testid="cluster-error">
          Cannot load the cluster's nodes: {poll.error()}
        </div>
      </Show>
      <Show when={poll.data()?.length === 0}>
        <p class="muted">No nodes reported.</p>
      </Show>
      <div class="nodes">
        <For each={poll.data() ?? []}>
          {(n) => <NodeCard node={n} served={(served.data() ?? []).find((g) => g.key === n.id)} />}
        </For>
      </div>
    </div>
  );
}

function NodeCard(props: { node: ClusterNode; served?: UsageGroup }) {
  const n = () => props.node;
  const memPct = () => (n().memory.total_bytes > 0 ? (100 * n().memory.used_bytes) / n().memory.total_bytes : 0);
  const cpuPct = () => Math.max(0, Math.min(100, n().cpu.usage_percent ?? 0));
  return (
    <article class="card node" data-testid="node-card" data-node-id={n().id} data-self={n().self ? 'true' : 'false'}>
      <header class="node-head">
        <span class={`dot ${n().status === 'online' ? 'ok' : 'bad'}`} aria-hidden="true" />
        <h2 data-testid="node-name">{n().name}</h2>
        <Show when={n().self}>
          <span class="tag">this node</span>
        </Show>
        <span class="spacer" />
        <span class={`badge ${n().status === 'online' ? 'ok' : 'bad'}`} data-testid="node-status">
          {n().status}
        </span>
      </header>
      <dl class="kv">
        <dt>address</dt>
        <dd class="mono" data-testid="node-address">
          {n().address}
        </dd>
        <dt>system</dt>
        <dd>
          {n().os} · {n().backend}
          {n().accelerator ? ` · ${n().accelerator}` : ''}
        </dd>
        <dt>CPU</dt>
        <dd data-testid="node-cpu" data-value={cpuPct().toFixed(1)} title={`${n().cpu.model}, ${n().cpu.cores} cores`}>
          <div class="meter">
            <div class="meter-fill" style={{ width: `${cpuPct()}%` }} />
          </div>
          {cpuPct().toFixed(0)}% of {n().cpu.cores} cores
        </dd>
        <dt>memory</dt>
        <dd data-testid="node-memory" data-used={n().memory.used_bytes} data-total={n().memory.total_bytes}>
          <div class="meter">
            <div class="meter-fill" style={{ width: `${memPct()}%` }} />
          </div>
          {fmtBytes(n().memory.used_bytes)} / {fmtBytes(n().memory.total_bytes)}
        </dd>
        <dt>models</dt>
        <dd data-testid="node-models">
          <Show when={n().models.length} fallback={<span class="muted">none</span>}>
            <ul class="plain">
              <For each={n().models}>
                {(m) => (
                  <li data-testid="node-model" data-backend={m.backend ?? ''}>
                    <span class="mono">{m.id}</span> <span class="muted">{fmtBytes(m.memory_bytes)}</span>
                    <Show when={m.backend}>
                      {' '}
                      <span class="tag">{backendName(m.backend ?? '')}</span>
                    </Show>
                  </li>
                )}
              </For>
            </ul>
          </Show>
        </dd>
        <dt>requests</dt>
        <dd data-testid="node-requests" data-in-flight={n().requests.in_flight} data-queued={n().requests.queued}>
          {n().requests.in_flight} in flight · {n().requests.queued} queued
        </dd>
        <dt>served</dt>
        <dd data-testid="node-served" data-requests={props.served?.requests ?? 0} data-tokens={props.served?.total_tokens ?? 0}>
          {fmtInt(props.served?.requests ?? 0)} request{props.served?.requests === 1 ? '' : 's'} · {fmtInt(props.served?.total_tokens ?? 0)} tokens
          <Show when={props.served?.prompt_tokens}>
            <span class="muted"> · {fmtShare(props.served?.cached_tokens, props.served?.prompt_tokens)} cache hit</span>
          </Show>
        </dd>
        <dt>last seen</dt>
        <dd data-testid="node-last-seen" title={new Date(n().last_seen_ms).toLocaleString()}>
          {fmtAgo(Date.now() - n().last_seen_ms)}
        </dd>
      </dl>
    </article>
  );
}
