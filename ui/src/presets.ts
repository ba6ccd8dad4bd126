// Presets: named sets of a chat's system prompt and sampling settings, kept in this browser, and
// the one new chats start from. A preset never names a model: the model is the chat's own choice.
import { createStore } from 'solid-js/store';
import type { ChatSettings } from './store';

/** What a preset sets: everything of a chat's settings but the model. */
export type PresetSettings = Omit<ChatSettings, 'model'>;

export interface Preset {
  name: string;
  settings: PresetSettings;
}

interface Presets {
  presets: Preset[];
  /** The preset new chats start from; null: the model's defaults. */
  defaultName: string | null;
}

const KEY = 'shoal.presets.v1';

function load(): Presets {
  try {
    const v = JSON.parse(localStorage.getItem(KEY) ?? 'null');
    if (v && Array.isArray(v.presets)) {
      const presets = v.presets.filter((p: Preset) => typeof p?.name === 'string' && p.settings && typeof p.settings === 'object');
      const defaultName = presets.some((p: Preset) => p.name === v.defaultName) ? v.defaultName : null;
      return { presets, defaultName };
    }
  } catch {
    // Unreadable: start without presets.
  }
  return { presets: [], defaultName: null };
}

const [state, setState] = createStore<Presets>(load());

export { state as presets };

function save(): void {
  try {
    localStorage.setItem(KEY, JSON.stringify(state));
  } catch {
    // Storage full or off: the presets last as long as the page.
  }
}

/** The preset part of a chat's settings (a copy). */
export function presetPart(s: ChatSettings): PresetSettings {
  const { model: _, ...rest } = s;
  return { ...rest, stop: [...rest.stop] };
}

/** Keeps `settings` as the preset `name` (a preset of that name is replaced). */
export function savePreset(name: string, settings: ChatSettings): void {
  const n = name.trim();
  if (!n) return;
  const p: Preset = { name: n, settings: presetPart(settings) };
  setState('presets', (list) => [...list.filter((x) => x.name !== n), p].sort((a, b) => a.name.localeCompare(b.name)));
  save();
}

export function deletePreset(name: string): void {
  setState('presets', (list) => list.filter((x) => x.name !== name));
  if (state.defaultName === name) setState('defaultName', null);
  save();
}

/** Makes `name` the preset new chats start from (null: the model's defaults). */
export function setDefaultPreset(name: string | null): void {
  setState('defaultName', name && state.presets.some((p) => p.name === name) ? name : null);
  save();
}

export function presetNamed(name: string): Preset | undefined {
  return state.presets.find((p) => p.name === name);
}

/** What a new chat starts from: the default preset's settings, if one is set. */
export function defaultPresetSettings(): PresetSettings | null {
  const p = state.defaultName ? presetNamed(state.defaultName) : undefined;
  return p ? { ...p.settings, stop: [...p.settings.stop] } : null;
}
