import { createSignal, For, Show } from 'solid-js';
import { hubFiles, hubSearch, type HubFiles, type HubRepo } from '../api';
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
  const [error, setError] = createSignal<string | null>(null);

  const run = async <T,>(what: string, f: () => Promise<T>): Promise<T | null> => {
    setBusy(what);
    setError(null);
    try {
      return await f();
    } catch (e) {
      setError(`Could not ${what}: ${(e as Error).message}`);
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
    const found = await run(`search the hub for "${q}"`, () => hubSearch(q));
    if (found) setResults(found);
  };
  const open = async (id: string) => {
    const files = await run(`list ${id}`, () => hubFiles(id));
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
        <p class="error-text small" role="alert" data-testid="hub-error">
          {error()}
        </p>
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
