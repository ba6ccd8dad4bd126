// The server's models as the UI shows them: the local models (aliases folded
// into the model they name), disk and memory figures, downloads from the hub
// with their progress, and load / unload / delete. Kept outside the views so
// a download keeps going (and keeps its progress) while the panel is closed
// or another tab is shown.
import { batch } from 'solid-js';
import { createStore, produce, reconcile } from 'solid-js/store';
import {
  deleteModel,
  listModels,
  loadModel,
  pullModel,
  unloadModel,
  type ModelInfo,
  type ModelList,
  type PullEvent,
} from './api';

export interface PullFile {
  name: string;
  size: number;
  bytes: number;
  done: boolean;
  cached: boolean;
  verified: boolean;
}

/** One download, from the request to `done` or `error`. */
export interface Pull {
  key: string;
  /** What was asked for: `org/name[@rev]`. */
  spec: string;
  file?: string;
  status: 'starting' | 'downloading' | 'done' | 'error';
  repo?: string;
  revision?: string;
  commit?: string;
  files: PullFile[];
  /** Bytes in place so far, over every file (only grows). */
  bytes: number;
  total: number;
  /** The file being transferred. */
  current?: string;
  error?: string;
  /** The model's id once it is in the library. */
  model?: string;
}

type Action = 'load' | 'unload' | 'delete';

interface ModelsState {
  /** The list was fetched at least once. */
  fetched: boolean;
  /** Local models, aliases left out. */
  models: ModelInfo[];
  /** Alias → the model it names. */
  aliases: Record<string, string>;
  summary: NonNullable<ModelList['shoal']> | null;
  error: string | null;
  pulls: Pull[];
  /** Models with a load / unload / delete under way. */
  busy: Record<string, Action | undefined>;
  /** The last load / unload / delete the server refused, with its message. */
  actionError: { id: string; action: Action; message: string } | null;
}

const [state, setState] = createStore<ModelsState>({
  fetched: false,
  models: [],
  aliases: {},
  summary: null,
  error: null,
  pulls: [],
  busy: {},
  actionError: null,
});

export { state as lib };

export const isAlias = (m: ModelInfo) => typeof m.shoal?.alias_of === 'string';
export const isPulled = (m: ModelInfo) => m.shoal?.source?.kind === 'hub';
/** An embedding model: listed in the Models panel, never offered for a chat. */
export const isEmbedding = (m: ModelInfo) => m.shoal?.kind === 'embedding';

/** The models a chat can use. */
export const chatModels = () => state.models.filter((m) => !isEmbedding(m));

let generation = 0;

/** Fetches the list again; an answer older than one already shown is dropped. */
export async function loadModels(): Promise<void> {
  const mine = ++generation;
  try {
    const list = await listModels();
    if (mine !== generation) return;
    const data = list.data ?? [];
    const aliases: Record<string, string> = {};
    for (const m of data) if (isAlias(m)) aliases[m.id] = m.shoal!.alias_of!;
    const models = data.filter((m) => !isAlias(m));
    batch(() => {
      // Reconciled by id: rows and options stay in place across refreshes.
      setState('models', reconcile(models, { key: 'id', merge: true }));
      setState('aliases', reconcile(aliases));
      setState({
        fetched: true,
        summary: list.shoal ?? null,
        error: models.length ? null : 'The server has no model: download one under Models.',
      });
    });
  } catch (e) {
    if (mine !== generation) return;
    setState({ fetched: true, error: `Cannot load the model list: ${(e as Error).message}` });
  }
}

/** The model a name refers to (an alias is followed to its model). */
export function resolveModel(name: string): string {
  return state.aliases[name] ?? name;
}

/** The server's configured model (the one given by path), else the first one. */
export function defaultModelId(): string {
  const chat = chatModels();
  return (chat.find((m) => m.shoal?.source?.kind === 'path') ?? chat[0])?.id ?? '';
}

export function modelById(id: string): ModelInfo | undefined {
  return state.models.find((m) => m.id === id);
}

/**
 * Whether a model can reason: `false` once the server has said it cannot (its
 * capabilities are known while it is loaded), `true` when it can, `null`
 * while unknown. A model that cannot reason answers a request for reasoning
 * as any other, so the chat does not offer one.
 */
export function canReason(id: string): boolean | null {
  const caps = modelById(resolveModel(id))?.shoal?.capabilities;
  return caps ? caps.reasoning === true : null;
}

/** Whether the model reads images (a GGUF with its projector); null while unknown. */
export function canSee(id: string): boolean | null {
  const caps = modelById(resolveModel(id))?.shoal?.capabilities;
  return caps ? caps.vision === true : null;
}

// ---- Downloads ------------------------------------------------------------------

let pullSeq = 0;

function patchPull(key: string, fn: (p: Pull) => void): void {
  setState('pulls', (p) => p.key === key, produce(fn));
}

function applyPullEvent(p: Pull, ev: PullEvent): void {
  switch (ev.type) {
    case 'plan':
      p.status = 'downloading';
      p.repo = ev.repo;
      p.revision = ev.revision;
      p.commit = ev.commit;
      p.total = ev.total_bytes;
      p.files = ev.files.map((f) => ({ name: f.name, size: f.size, bytes: 0, done: false, cached: false, verified: false }));
      break;
    case 'progress': {
      p.status = 'downloading';
      p.current = ev.file;
      p.bytes = Math.max(p.bytes, ev.bytes);
      if (ev.total_bytes) p.total = ev.total_bytes;
      const f = p.files.find((x) => x.name === ev.file);
      if (f) f.bytes = Math.max(f.bytes, ev.file_bytes);
      else p.files.push({ name: ev.file, size: ev.file_total, bytes: ev.file_bytes, done: false, cached: false, verified: false });
      break;
    }
    case 'file_done': {
      const f = p.files.find((x) => x.name === ev.file);
      if (f) {
        f.done = true;
        f.cached = ev.cached;
        f.verified = ev.verified;
        f.bytes = f.size;
      }
      // A file already in the library sends no progress: count it here.
      p.bytes = Math.max(p.bytes, p.files.reduce((n, x) => n + x.bytes, 0));
      if (p.current === ev.file) p.current = undefined;
      break;
    }
    case 'done':
      p.status = 'done';
      p.current = undefined;
      p.bytes = Math.max(p.bytes, p.total);
      for (const f of p.files) {
        f.done = true;
        f.bytes = f.size;
      }
      p.model = ev.model?.id;
      break;
    case 'error':
      p.status = 'error';
      p.current = undefined;
      p.error = ev.error?.message || 'the download failed';
      break;
  }
}

/** The share of a download in place, 0–100. */
export function pullPercent(p: Pull): number {
  if (p.status === 'done') return 100;
  if (!p.total) return 0;
  return Math.min(100, (100 * p.bytes) / p.total);
}

/** Starts downloading `org/name[@rev]` (a download of the same thing already running is not started twice). */
export function startPull(spec: string, file?: string): void {
  spec = spec.trim();
  file = file?.trim() || undefined;
  if (!spec) return;
  if (state.pulls.some((p) => p.spec === spec && p.file === file && (p.status === 'starting' || p.status === 'downloading'))) return;
  const key = `pull-${++pullSeq}`;
  const pull: Pull = { key, spec, file, status: 'starting', files: [], bytes: 0, total: 0 };
  setState('pulls', (list) => [pull, ...list]);
  void (async () => {
    try {
      await pullModel(spec, file, (ev) => {
        patchPull(key, (p) => applyPullEvent(p, ev));
        if (ev.type === 'done') void loadModels();
      });
    } catch (e) {
      patchPull(key, (p) => {
        p.status = 'error';
        p.error = (e as Error).message;
      });
    }
  })();
}

export function dismissPull(key: string): void {
  setState('pulls', (list) => list.filter((p) => p.key !== key || p.status === 'starting' || p.status === 'downloading'));
}

// ---- Load, unload, delete ---------------------------------------------------------

async function act(id: string, action: Action, run: () => Promise<unknown>): Promise<boolean> {
  if (state.busy[id]) return false;
  batch(() => {
    setState('busy', id, action);
    setState('actionError', null);
  });
  try {
    await run();
    return true;
  } catch (e) {
    setState('actionError', { id, action, message: (e as Error).message });
    return false;
  } finally {
    setState('busy', id, undefined);
    await loadModels();
  }
}

export const loadOne = (id: string) => act(id, 'load', () => loadModel(id));
export const unloadOne = (id: string) => act(id, 'unload', () => unloadModel(id));
export const deleteOne = (id: string) => act(id, 'delete', () => deleteModel(id));

export function dismissActionError(): void {
  setState('actionError', null);
}
