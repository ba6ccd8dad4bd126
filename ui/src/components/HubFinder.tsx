import { createSignal, For, Show } from 'solid-js';
import { ApiError, hubFiles, hubSearch, type HubFiles, type HubRepo } from '../api';
import { fmtBytes, fmtInt } from '../format';
import { startPull } from '../models';

/**
 * Finds a model on the hub before downloading it: search by name, open a
 * repository to see its files with quantization, size, the memory the
 * server would count each at once loaded and whether that fits its budget,
 * then download one with the progress shown below the panel.
 */
export function HubFinder() {
  const [query, setQuery] = createSignal('');
  const [results, setResults] = createSignal<HubRepo[] | null>(null);
  const [repo, setRepo] = createSignal<HubFiles | null>(null);
  const [busy, setBusy] = createSignal<string | null>(null);
  const [error, setError] = createSignal<HubProblem | null>(null);

  const run = async <T,>(what: string, f: () => Promise<T>, again: () => void): Promise<T | null> => {
    setBusy(what);
    setError(null);
    try {
      return await f();
    } catch (e) {
      setError(hubProblem(what, e as Error, again));
      return null;
    } finally {
      setBusy(null);
    }
  };
  const search = async (e: Event) => {
    e.preventDefault();
    const q = query().trim();
    if (!q) return;
    setRepo(null);
    const found = await run(`search the hub for "${q}"`, () => hubSearch(q), () => void search(e));
    if (found) setResults(found);
  };
  const open = async (id: string) => {
    const files = await run(`list ${id}`, () => hubFiles(id), () => void open(id));
    if (files) setRepo(files);
  };

  return (
    <div class="hub-finder" data-testid="hub-finder">
      <form class="pull-form" onSubmit={(e) => void search(e)}>
        <label class="field grow">
          <span>Find a model on the hub</span>
          <input
            type="search"
            data-testid="hub-search"
            placeholder="a name, e.g. qwen coder gguf"
            spellcheck={false}
            autocomplete="off"
            value={query()}
            onInput={(e) => setQuery(e.currentTarget.value)}
          />
        </label>
        <button class="btn" type="submit" data-testid="hub-search-button" disabled={!query().trim() || !!busy()}>
          Search
        </button>
      </form>
      <Show when={busy()}>
        <p class="muted small" data-testid="hub-busy">
          {busy()}…
        </p>
      </Show>
      <Show when={error()}>
        {(p) => (
          <div class="error-text small hub-error" role="alert" data-testid="hub-error" data-offline={p().offline ? 'true' : 'false'}>
            <p>{p().text}</p>
            <Show when={p().detail}>
              <p class="muted hub-error-detail" data-testid="hub-error-detail">
                {p().detail}
              </p>
            </Show>
            <button class="btn small" data-testid="hub-retry" onClick={p().again}>
              Retry
            </button>
          </div>
        )}
      </Show>
      <Show when={results() && !repo()}>
        <Show
          when={results()!.length > 0}
          fallback={
            <p class="muted small" data-testid="hub-no-results">
              No model on the hub has that in its name.
            </p>
          }
        >
          <ul class="plain hub-results">
            <For each={results()}>
              {(r) => (
                <li data-testid="hub-result" data-id={r.id}>
                  <button class="link mono" data-testid="hub-open" onClick={() => void open(r.id)}>
                    {r.id}
                  </button>
                  <span class="muted small">
                    {' '}
                    {fmtInt(r.downloads)} downloads{r.gguf ? ' · GGUF' : ''}
                  </span>
                </li>
              )}
            </For>
          </ul>
        </Show>
      </Show>
      <Show when={repo()}>
        {(r) => (
          <div class="hub-files" data-testid="hub-files" data-repo={r().repo}>
            <div class="hub-files-head">
              <button class="btn small" data-testid="hub-back" onClick={() => setRepo(null)}>
                ← Results
              </button>
              <b class="mono">{r().repo}</b>
              <span class="muted small">
                {[r().architecture, r().context_length ? `${fmtInt(r().context_length)} context` : null].filter(Boolean).join(' · ')}
              </span>
            </div>
            <div class="table-wrap">
              <table class="table">
                <thead>
                  <tr>
                    <th>File</th>
                    <th>Quantization</th>
                    <th class="num">Download</th>
                    <th class="num">Memory once loaded</th>
                    <th />
                  </tr>
                </thead>
                <tbody>
                  <For each={r().files}>
                    {(f) => (
                      <tr data-testid="hub-file" data-name={f.name} data-fits={f.fits == null ? '' : String(f.fits)}>
                        <td class="mono ellipsis" title={f.name} data-label="File">
                          {f.kind === 'directory' ? `${f.name} (safetensors)` : f.name}
                        </td>
                        <td data-testid="hub-file-quant" data-label="Quantization">
                          {f.quantization ?? '—'}
                        </td>
                        <td class="num" data-testid="hub-file-size" data-bytes={f.size_bytes} data-label="Download">
                          {fmtBytes(f.size_bytes)}
                        </td>
                        <td
                          class="num"
                          data-testid="hub-file-memory"
                          data-bytes={f.estimated_memory_bytes ?? ''}
                          data-label="Memory"
                          title="The server's estimate: the file, its KV cache and buffers"
                        >
                          <Show
                            when={f.estimated_memory_bytes != null}
                            fallback={
                              <span class="muted" data-testid="hub-file-unknown" title={f.unavailable ?? ''}>
                                {f.unavailable ? 'cannot run here' : 'after download'}
                              </span>
                            }
                          >
                            {fmtBytes(f.estimated_memory_bytes)}{' '}
                            <Show
                              when={f.fits}
                              fallback={
                                <span
                                  class="tag warn"
                                  data-testid="hub-file-fit"
                                  title={`More than this server's memory budget (${fmtBytes(r().memory_budget_bytes)})`}
                                >
                                  too big
                                </span>
                              }
                            >
                              <span class="tag ok" data-testid="hub-file-fit" title={`Within the memory budget of ${fmtBytes(r().memory_budget_bytes)}`}>
                                fits
                              </span>
                            </Show>
                          </Show>
                        </td>
                        <td>
                          <button
                            class="btn small primary"
                            data-testid="hub-file-download"
                            title={f.fits === false ? 'It downloads, but will not load within the memory budget' : ''}
                            onClick={() => startPull(f.pull.model, f.pull.file ?? undefined)}
                          >
                            Download
                          </button>
                        </td>
                      </tr>
                    )}
                  </For>
                </tbody>
              </table>
            </div>
          </div>
        )}
      </Show>
    </div>
  );
}

/** A failed hub request in words a person can act on, and how to try again. */
interface HubProblem {
  text: string;
  /** The server's own words, when the text above stands in for them. */
  detail: string | null;
  /** The server could not reach the hub at all (no network, or a wrong HF_ENDPOINT). */
  offline: boolean;
  again: () => void;
}

function hubProblem(what: string, e: Error, again: () => void): HubProblem {
  const unreachable = e instanceof ApiError && e.status === 502 && /cannot reach the hub/i.test(e.message);
  if (unreachable) {
    return {
      text:
        'The model hub cannot be reached from this server: it may have no network, or HF_ENDPOINT may point somewhere ' +
        'else. Models already on this server still work.',
      detail: e.message,
      offline: true,
      again,
    };
  }
  return { text: `Could not ${what}: ${e.message}`, detail: null, offline: false, again };
}
