import { createSignal, For, onCleanup, onMount, Show } from 'solid-js';
import type { ModelInfo } from '../api';
import { ErrorBanner } from './ErrorBanner';
import { HubFinder } from './HubFinder';
import { backendName, fmtBytes } from '../format';
import {
  deleteOne,
  dismissActionError,
  dismissPull,
  isEmbedding,
  isPulled,
  lib,
  loadModels,
  loadOne,
  pullPercent,
  startPull,
  unloadOne,
  type Pull,
} from '../models';

const REFRESH_MS = 3000;

/** A model's quantization (or its format when it has none), for labels. */
export function quantOf(m: ModelInfo): string {
  return m.shoal?.quantization || m.shoal?.format || '—';
}

/** One line about a model for the picker: quantization, size on disk, memory if loaded, engine. */
export function modelLabel(m: ModelInfo): string {
  const s = m.shoal;
  const parts = [m.id];
  // The quantization once: many file names carry it already.
  if (s?.quantization && !m.id.includes(s.quantization)) parts.push(s.quantization);
  if (s?.size_bytes != null) parts.push(fmtBytes(s.size_bytes));
  if (s?.loaded) parts.push(s.memory_bytes != null ? `loaded, ${fmtBytes(s.memory_bytes)}` : 'loaded');
  parts.push(s?.backend ? `on ${backendName(s.backend)}` : 'cannot run');
  return parts.join(' · ');
}

/**
 * The server's models: what is on disk and in memory, load / unload /
 * delete, the model this chat uses, and downloads from the hub. Refreshed
 * every few seconds while shown.
 */
export function ModelsPanel(props: { selected: string; onUse: (id: string) => void }) {
  const [spec, setSpec] = createSignal('');
  const [file, setFile] = createSignal('');
  onMount(() => void loadModels());
  const timer = setInterval(() => void loadModels(), REFRESH_MS);
  onCleanup(() => clearInterval(timer));

  const pulled = () => lib.models.filter(isPulled).length;
  /** Every listed model's files, configured ones included. */
  const allBytes = () => lib.models.reduce((sum, m) => sum + (m.shoal?.size_bytes ?? 0), 0);
  const submit = (e: Event) => {
    e.preventDefault();
    if (!spec().trim()) return;
    startPull(spec(), file());
    setSpec('');
    setFile('');
  };

  return (
    <div class="models-panel" data-testid="models-panel">
      <div class="models-head">
        <b>Models</b>
        <span
          class="muted"
          data-testid="library-bytes"
          data-bytes={lib.summary?.library_bytes ?? ''}
          data-all-bytes={allBytes()}
          title={lib.summary?.library_path ? `Downloads go to ${lib.summary.library_path}` : ''}
        >
          On disk: {fmtBytes(allBytes())} in {lib.models.length} {lib.models.length === 1 ? 'model' : 'models'},{' '}
          {pulled() === 0
            ? 'none downloaded from the hub'
            : `${pulled()} downloaded from the hub (${fmtBytes(lib.summary?.library_bytes ?? 0)})`}
        </span>
        <Show when={lib.summary?.memory_budget_bytes != null}>
          <span class="muted" data-testid="memory-use" data-loaded={lib.summary?.memory_loaded_bytes ?? 0} data-budget={lib.summary?.memory_budget_bytes}>
            Memory: {fmtBytes(lib.summary?.memory_loaded_bytes ?? 0)} of {fmtBytes(lib.summary?.memory_budget_bytes)} budget
          </span>
        </Show>
      </div>

      <Show when={lib.actionError}>
        {(err) => (
          <ErrorBanner testid="model-action-error" action={{ label: 'Dismiss', onClick: dismissActionError }}>
            Could not {err().action} <span class="mono">{err().id}</span>: {err().message}
          </ErrorBanner>
        )}
      </Show>

      {/* A narrow panel (a side column, a phone) shows each model as a card: see .models-panel in styles.css. */}
      <div class="table-wrap">
        <table class="table models-table card-rows" data-testid="models-table">
          <thead>
            <tr>
              <th>Model</th>
              <th>Quantization</th>
              <th>Backend</th>
              <th class="num">On disk</th>
              <th class="num">Memory</th>
              <th>State</th>
              <th />
            </tr>
          </thead>
          <tbody>
            <Show when={lib.models.length === 0}>
              <tr>
                <td colspan="7" class="muted">
                  {lib.fetched ? 'No models yet: download one below.' : 'loading…'}
                </td>
              </tr>
            </Show>
            <For each={lib.models}>
              {(m) => <ModelRow model={m} selected={props.selected === m.id} onUse={() => props.onUse(m.id)} />}
            </For>
          </tbody>
        </table>
      </div>

      <HubFinder />

      <form class="pull-form" data-testid="pull-form" onSubmit={submit}>
        <TextField
          label="Download a model from the hub"
          testid="pull-spec"
          grow
          placeholder="org/name or org/name@revision"
          value={spec()}
          onInput={setSpec}
        />
        <TextField label="File (optional)" testid="pull-file" placeholder="model.Q4_K_M.gguf" value={file()} onInput={setFile} />
        <button class="btn primary" type="submit" data-testid="pull-button" disabled={!spec().trim()}>
          Download
        </button>
      </form>

      <Show when={lib.pulls.length > 0}>
        <ul class="pulls plain" data-testid="pulls">
          <For each={lib.pulls}>{(p) => <PullCard pull={p} selected={props.selected} onUse={props.onUse} />}</For>
        </ul>
      </Show>
    </div>
  );
}

function ModelRow(props: { model: ModelInfo; selected: boolean; onUse: () => void }) {
  const m = () => props.model;
  const s = () => m().shoal ?? {};
  const busy = () => lib.busy[m().id];
  const [confirming, setConfirming] = createSignal(false);
  const source = () => {
    const src = s().source;
    if (src?.kind === 'hub') return `hub: ${src.repo} @ ${src.commit.slice(0, 7)}`;
    if (src?.kind === 'path') return 'configured model file';
    return '';
  };
  return (
    <tr
      data-testid="model-row"
      data-id={m().id}
      data-loaded={s().loaded ? 'true' : 'false'}
      data-source={s().source?.kind ?? ''}
      data-selected={props.selected ? 'true' : 'false'}
      classList={{ selected: props.selected }}
    >
      <td class="model-name row-head">
        <div class="mono ellipsis wide" data-testid="model-id" title={s().path ?? m().id}>
          {m().id}
        </div>
        <div class="muted small" data-testid="model-source" title={s().path ?? ''}>
          {source()}
          {s().parameters ? ` · ${(s().parameters! / 1e6).toFixed(0)}M params` : ''}
          {s().context_length ? ` · ${s().context_length} ctx` : ''}
        </div>
        <Show when={isEmbedding(m())}>
          <span
            class="tag"
            data-testid="model-kind"
            title="An embedding model: it answers /v1/embeddings and /api/embed, not chats"
          >
            embedding · {s().embedding?.dimensions ?? '?'} dims · {s().embedding?.pooling ?? '?'} pooling
          </span>
        </Show>
        <Show when={s().capabilities?.vision}>
          <span class="tag" data-testid="model-vision" title="Reads images: a GGUF with its vision projector (mmproj) beside it">
            vision
          </span>
        </Show>
      </td>
      <td data-testid="model-quant" data-label="Quantization">{quantOf(m())}</td>
      <td data-testid="model-backend" data-label="Backend" data-backend={s().backend ?? ''} title={s().unavailable ?? ''}>
        <Show when={s().backend} fallback={<span class="tag warn">cannot run</span>}>
          {backendName(s().backend ?? '')}
        </Show>
      </td>
      <td class="num" data-testid="model-size" data-label="On disk" data-bytes={s().size_bytes ?? ''}>
        {fmtBytes(s().size_bytes)}
      </td>
      <td class="num" data-testid="model-memory" data-label="Memory" data-bytes={s().memory_bytes ?? ''}>
        <Show
          when={s().loaded}
          fallback={
            <span class="muted" title="Estimated memory when loaded">
              ≈ {fmtBytes(s().estimated_memory_bytes)}
            </span>
          }
        >
          {fmtBytes(s().memory_bytes)}
        </Show>
      </td>
      <td>
        <Show
          when={s().loaded}
          fallback={
            <span class="tag" data-testid="model-state" title="On disk; it loads on its first request">
              not loaded
            </span>
          }
        >
          <span class="badge ok" data-testid="model-state" title={[s().dtype, s().device].filter(Boolean).join(' on ')}>
            loaded
          </span>
        </Show>
      </td>
      <td class="actions">
        <Show
          when={!confirming()}
          fallback={
            <span class="confirm" data-testid="delete-confirm">
              Delete {fmtBytes(s().size_bytes)}?{' '}
              <button
                class="btn small danger"
                data-testid="delete-confirm-yes"
                onClick={() => {
                  setConfirming(false);
                  void deleteOne(m().id);
                }}
              >
                Delete
              </button>{' '}
              <button class="btn small" data-testid="delete-confirm-no" onClick={() => setConfirming(false)}>
                Cancel
              </button>
            </span>
          }
        >
          <Show when={!isEmbedding(m())}>
            <Show
              when={!props.selected}
              fallback={
                <span class="tag in-use" data-testid="model-in-use">
                  in use
                </span>
              }
            >
              <button class="btn small" data-testid="model-use" onClick={props.onUse}>
                Use
              </button>
            </Show>{' '}
          </Show>
          <Show
            when={s().loaded}
            fallback={
              <button class="btn small" data-testid="model-load" disabled={!!busy()} onClick={() => void loadOne(m().id)}>
                {busy() === 'load' ? 'Loading…' : 'Load'}
              </button>
            }
          >
            <button class="btn small" data-testid="model-unload" disabled={!!busy()} onClick={() => void unloadOne(m().id)}>
              {busy() === 'unload' ? 'Unloading…' : 'Unload'}
            </button>
          </Show>{' '}
          <Show when={isPulled(m())}>
            <button
              class="btn small"
              data-testid="model-delete"
              title="Delete this model's files from the library"
              disabled={!!busy()}
              onClick={() => setConfirming(true)}
            >
              {busy() === 'delete' ? 'Deleting…' : 'Delete'}
            </button>
          </Show>
        </Show>
      </td>
    </tr>
  );
}

function PullCard(props: { pull: Pull; selected: string; onUse: (id: string) => void }) {
  const p = () => props.pull;
  const pct = () => pullPercent(p());
  const running = () => p().status === 'starting' || p().status === 'downloading';
  const statusBadge = () =>
    ({
      starting: ['info', 'starting'],
      downloading: ['info', 'downloading'],
      done: ['ok', 'done'],
      error: ['bad', 'failed'],
    })[p().status];
  return (
    <li class="card pull" data-testid="pull" data-status={p().status} data-spec={p().spec}>
      <div class="pull-head">
        <span class="mono ellipsis wide" title={p().spec}>
          {p().spec}
          {p().file ? ` (${p().file})` : ''}
        </span>
        <Show when={p().commit}>
          <span class="muted small" title={p().commit}>
            @ {p().revision} {p().commit!.slice(0, 7)}
          </span>
        </Show>
        <span class="spacer" />
        <span class={`badge ${statusBadge()[0]}`} data-testid="pull-status">
          {statusBadge()[1]}
        </span>
        <Show when={!running()}>
          <button class="icon-btn small" title="Dismiss" aria-label="Dismiss" data-testid="pull-dismiss" onClick={() => dismissPull(p().key)}>
            ×
          </button>
        </Show>
      </div>
      <Show when={p().status !== 'error' || p().total > 0}>
        <div
          class="meter"
          role="progressbar"
          aria-valuemin="0"
          aria-valuemax="100"
          aria-valuenow={Math.floor(pct())}
          data-testid="pull-progress"
          data-percent={Math.floor(pct())}
          data-bytes={p().bytes}
          data-total={p().total}
        >
          <div class="meter-fill" classList={{ bad: p().status === 'error', ok: p().status === 'done' }} style={{ width: `${pct()}%` }} />
        </div>
        <div class="small" data-testid="pull-progress-text">
          <b>{Math.floor(pct())}%</b>{' '}
          <span class="muted">
            {fmtBytes(p().bytes)} of {p().total ? fmtBytes(p().total) : '…'}
            {p().current ? ` · ${p().current}` : ''}
          </span>
        </div>
      </Show>
      <Show when={p().files.length > 0}>
        <ul class="plain pull-files">
          <For each={p().files}>
            {(f) => (
              <li data-testid="pull-file-row" data-done={f.done ? 'true' : 'false'}>
                <span class="mono" data-testid="pull-file-name">
                  {f.name}
                </span>{' '}
                <span class="muted">{fmtBytes(f.size)}</span>{' '}
                <Show when={f.done}>
                  <span class="tag" title={f.verified ? 'checksum verified' : 'the hub listed no checksum'}>
                    {f.cached ? 'already here' : f.verified ? '✓ verified' : '✓'}
                  </span>
                </Show>
              </li>
            )}
          </For>
        </ul>
      </Show>
      <Show when={p().error}>
        <div class="error-text" role="alert" data-testid="pull-error">
          {p().error}
        </div>
      </Show>
      <Show when={p().status === 'done' && p().model}>
        <div class="small pull-done" data-testid="pull-done">
          Added <span class="mono">{p().model}</span>{' '}
          <Show
            when={props.selected !== p().model}
            fallback={<span class="tag in-use">in use</span>}
          >
            <button class="btn small" data-testid="pull-use" onClick={() => props.onUse(p().model!)}>
              Use in this chat
            </button>
          </Show>
        </div>
      </Show>
    </li>
  );
}

/** A labelled one-line input for names and paths (no spellcheck, no autofill). */
function TextField(props: {
  label: string;
  testid: string;
  placeholder: string;
  value: string;
  onInput: (v: string) => void;
  grow?: boolean;
}) {
  return (
    <label class="field" classList={{ grow: !!props.grow }}>
      <span>{props.label}</span>
      <input
        type="text"
        data-testid={props.testid}
        placeholder={props.placeholder}
        spellcheck={false}
        autocomplete="off"
        value={props.value}
        onInput={(e) => props.onInput(e.currentTarget.value)}
      />
    </label>
  );
}
