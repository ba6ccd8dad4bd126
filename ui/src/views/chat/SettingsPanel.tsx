// The per-chat settings panel (system prompt, sampling, max tokens, stop sequences, reasoning)
// and the checks on what it holds. Apart from Chat.tsx because it is a form of its own; it also
// owns `unreadable`, the one record of fields whose text is not a number, which `settingsProblem`
// reads so the chat view can refuse to send until they are fixed.
import { createSignal, For, onCleanup, Show, untrack } from 'solid-js';
import { updateSettings } from '../../chatState';
import { canReason } from '../../models';
import { SAMPLING, samplingProblem, type SamplingField } from '../../chat';
import type { ModelInfo } from '../../api';
import { DEFAULT_SETTINGS, type Conversation } from '../../store';
import { modelTitles, setModelTitles } from '../../title';
import { deletePreset, presetNamed, presetPart, presets, savePreset, setDefaultPreset } from '../../presets';

/** Settings fields whose text is not a number, by field (the chat's settings hold null for them meanwhile). */
const [unreadable, setUnreadable] = createSignal<Record<string, string>>({});

/** Why a chat's settings cannot be sent as they are (checked before sending); null when they can. */
export function settingsProblem(c: Conversation | undefined, model: ModelInfo | undefined): string | null {
  if (!c) return null;
  return (
    Object.values(unreadable())[0] ??
    maxTokensProblem(c.settings.maxTokens, model?.shoal?.context_length) ??
    SAMPLING.map((f) => samplingProblem(f, c.settings[f.key])).find((p) => p != null) ??
    null
  );
}

function decodeStop(line: string): string {
  return line.replace(/\\(n|t|\\)/g, (_, c) => (c === 'n' ? '\n' : c === 't' ? '\t' : '\\'));
}

function encodeStop(s: string): string {
  return s.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/\t/g, '\\t');
}

/** Why `max` cannot be a reply cap for a model with this window; null when it can. */
function maxTokensProblem(max: number | null, context: number | null | undefined): string | null {
  if (max == null) return null;
  if (!Number.isInteger(max) || max < 1) return 'Max tokens must be a whole number of at least 1';
  if (context && max > context) {
    return `Max tokens ${max.toLocaleString('en-US')} is more than the model's ${context.toLocaleString('en-US')}-token window`;
  }
  return null;
}

function numberOrNull(v: string): number | null {
  if (v.trim() === '') return null;
  const n = Number(v);
  return Number.isFinite(n) ? n : null;
}

/**
 * Per-chat settings, under the presets bar. The form is drawn afresh when a
 * preset or the model's defaults replace what it holds (its inputs start
 * from the chat's values and write back as you type).
 */
export function SettingsPanel(props: { conv: Conversation; model: ModelInfo | undefined }) {
  const [drawn, setDrawn] = createSignal(0);
  return (
    <div class="settings" data-testid="settings-panel">
      <b class="span2">Settings of this chat</b>
      <PresetBar conv={props.conv} replaced={() => setDrawn(drawn() + 1)} />
      {/* One item per drawing: a new number draws the form anew. */}
      <For each={[drawn()]}>{() => <SettingsForm conv={props.conv} model={props.model} />}</For>
    </div>
  );
}

/**
 * Presets: apply one, keep this chat's settings as one, choose the one new
 * chats start from, or go back to the model's own defaults.
 */
function PresetBar(props: { conv: Conversation; replaced: () => void }) {
  const [naming, setNaming] = createSignal(false);
  const [name, setName] = createSignal('');
  const apply = (settings: Partial<Conversation['settings']>) => {
    updateSettings({ ...settings, stop: [...(settings.stop ?? [])] });
    props.replaced();
  };
  return (
    <div class="presets span2" data-testid="presets">
      <select
        data-testid="preset-pick"
        aria-label="Apply a preset"
        value=""
        onChange={(e) => {
          const p = presetNamed(e.currentTarget.value);
          e.currentTarget.value = '';
          if (p) apply(p.settings);
        }}
      >
        <option value="">Apply a preset…</option>
        <For each={presets.presets}>{(p) => <option value={p.name}>{p.name}</option>}</For>
      </select>
      <Show
        when={naming()}
        fallback={
          <button type="button" class="btn small" data-testid="preset-save-as" onClick={() => setNaming(true)}>
            Save as preset
          </button>
        }
      >
        <form
          class="preset-name"
          onSubmit={(e) => {
            e.preventDefault();
            savePreset(name(), props.conv.settings);
            setName('');
            setNaming(false);
          }}
        >
          <input
            data-testid="preset-name"
            placeholder="Preset name"
            value={name()}
            ref={(el) => queueMicrotask(() => el.focus())}
            onInput={(e) => setName(e.currentTarget.value)}
            onKeyDown={(e) => e.key === 'Escape' && setNaming(false)}
          />
          <button type="submit" class="btn small primary" data-testid="preset-save" disabled={!name().trim()}>
            Save
          </button>
        </form>
      </Show>
      <label class="preset-default">
        <span class="muted small">New chats start from</span>
        <select
          data-testid="preset-default"
          value={presets.defaultName ?? ''}
          onChange={(e) => setDefaultPreset(e.currentTarget.value || null)}
        >
          <option value="">the model's defaults</option>
          <For each={presets.presets}>
            {(p) => (
              <option value={p.name} selected={p.name === presets.defaultName}>
                {p.name}
              </option>
            )}
          </For>
        </select>
      </label>
      <Show when={presets.defaultName}>
        {(n) => (
          <button
            type="button"
            class="btn small"
            data-testid="preset-delete"
            title={`Forget the preset "${n()}"`}
            onClick={() => deletePreset(n())}
          >
            Delete “{n()}”
          </button>
        )}
      </Show>
      <button
        type="button"
        class="btn small"
        data-testid="reset-settings"
        title="Empty every field, so the model's own defaults apply (the chat keeps its model)"
        onClick={() => apply(presetPart({ ...DEFAULT_SETTINGS, model: '' }))}
      >
        Reset to model defaults
      </button>
    </div>
  );
}

/** The form itself. */
function SettingsForm(props: { conv: Conversation; model: ModelInfo | undefined }) {
  const s = untrack(() => props.conv.settings);
  const context = () => props.model?.shoal?.context_length ?? null;
  // Text that is not a number leaves the setting empty; it is refused until fixed or the panel closes.
  onCleanup(() => setUnreadable({}));
  const onNumber = (key: string, label: string, el: HTMLInputElement, save: (v: number | null) => void) => {
    const n = el.validity.badInput ? null : numberOrNull(el.value);
    const bad = el.validity.badInput || (el.value.trim() !== '' && n == null);
    setUnreadable(({ [key]: _, ...rest }) => (bad ? { ...rest, [key]: `${label} must be a number` } : rest));
    save(n);
  };
  const maxProblem = () => unreadable().maxTokens ?? maxTokensProblem(props.conv.settings.maxTokens, context());
  /** Whether the chat's model can reason (`null` until the server knows). */
  const reasons = () => (props.model ? canReason(props.model.id) : null);
  const field = (key: SamplingField['key']) => SAMPLING.find((f) => f.key === key)!;
  const sampling = (f: SamplingField) => <SamplingInput field={f} conv={props.conv} model={props.model} onNumber={onNumber} />;
  return (
    <>
      <label class="field span2">
        <span>System prompt</span>
        <textarea
          data-testid="setting-system"
          rows={2}
          placeholder="Empty: the model's default"
          value={s.systemPrompt}
          onInput={(e) => updateSettings({ systemPrompt: e.currentTarget.value })}
        />
      </label>
      {sampling(field('temperature'))}
      <label class="field">
        <span>Max tokens</span>
        <input
          data-testid="setting-max-tokens"
          type="number"
          min="1"
          max={context() ?? undefined}
          step="1"
          placeholder="the context window"
          value={s.maxTokens ?? ''}
          aria-invalid={maxProblem() ? 'true' : 'false'}
          onInput={(e) => onNumber('maxTokens', 'Max tokens', e.currentTarget, (v) => updateSettings({ maxTokens: v }))}
        />
        <Show when={context()}>
          <span class="muted small field-note" data-testid="context-window">
            of a {context()!.toLocaleString('en-US')}-token window
          </span>
        </Show>
        <Show when={maxProblem()}>
          <span class="error-text small" role="alert" data-testid="setting-max-tokens-error">
            {maxProblem()}
          </span>
        </Show>
      </label>
      <For each={SAMPLING.filter((f) => f.key !== 'temperature')}>{sampling}</For>
      <label class="field">
        <span>Stop sequences</span>
        <textarea
          data-testid="setting-stop"
          rows={2}
          placeholder={'one per line (\\n for a newline)'}
          value={s.stop.map(encodeStop).join('\n')}
          onInput={(e) =>
            updateSettings({
              stop: e.currentTarget.value
                .split('\n')
                .filter((l) => l !== '')
                .map(decodeStop),
            })
          }
        />
      </label>
      <label class="field check">
        <input
          data-testid="setting-reasoning"
          type="checkbox"
          checked={s.reasoning && reasons() !== false}
          disabled={reasons() === false}
          onChange={(e) => updateSettings({ reasoning: e.currentTarget.checked })}
        />
        <span title='Sends reasoning_effort: "low"; the thinking shows in a collapsible block above the answer'>Reasoning</span>
        <Show when={reasons() === false}>
          <span class="muted small" data-testid="reasoning-unavailable">
            This model cannot reason: it has no thinking section of its own, so it answers directly.
          </span>
        </Show>
      </label>
      <fieldset class="field span2 tool-settings" data-testid="tool-settings">
        <legend title="Tools of the MCP servers in the server's mcp.json (the Server page lists them)">Tools (MCP)</legend>
        <label class="check">
          <input
            data-testid="setting-tools"
            type="checkbox"
            checked={s.tools}
            onChange={(e) => updateSettings({ tools: e.currentTarget.checked })}
          />
          <span>Offer the model the MCP servers' tools; each call waits for your Allow</span>
        </label>
        <label class="check">
          <input
            data-testid="setting-auto-read-only"
            type="checkbox"
            checked={s.autoReadOnly}
            disabled={!s.tools}
            onChange={(e) => updateSettings({ autoReadOnly: e.currentTarget.checked })}
          />
          <span title="readOnlyHint: the server's word, not a guarantee">Run tools their server marks read-only without asking</span>
        </label>
        <label class="check">
          <input
            data-testid="setting-tool-required"
            type="checkbox"
            checked={s.toolChoice === 'required'}
            disabled={!s.tools}
            onChange={(e) => updateSettings({ toolChoice: e.currentTarget.checked ? 'required' : 'auto' })}
          />
          <span title='tool_choice: "required": a small model that never calls tools by itself can still use them'>
            The model must call a tool in each turn
          </span>
        </label>
        <label class="inline">
          <span>Most model turns per reply</span>
          <input
            data-testid="setting-tool-steps"
            type="number"
            min="1"
            max="50"
            step="1"
            disabled={!s.tools}
            value={untrack(() => s.toolSteps)}
            onInput={(e) => {
              const v = Number(e.currentTarget.value);
              if (Number.isInteger(v) && v >= 1 && v <= 50) updateSettings({ toolSteps: v });
            }}
          />
        </label>
      </fieldset>
      <label class="field check span2">
        <input
          data-testid="setting-model-titles"
          type="checkbox"
          checked={modelTitles()}
          onChange={(e) => setModelTitles(e.currentTarget.checked)}
        />
        <span title="After a chat's first reply, its model writes the chat's title: one short request, in the usage log like any other">
          Titles written by the model (every chat, in this browser)
        </span>
      </label>
      <p class="muted small span2" data-testid="server-settings-link">
        Settings of the server itself (Ollama's port, the prompt cache) are on the{' '}
        <a href="/server">Server</a> page.
      </p>
    </>
  );
}

/**
 * One sampling setting: empty, the model's default applies, named beside the
 * field with where it came from (`/v1/models` `sampling_defaults`); a value
 * overrides it for this chat.
 */
function SamplingInput(props: {
  field: SamplingField;
  conv: Conversation;
  model: ModelInfo | undefined;
  onNumber: (key: string, label: string, el: HTMLInputElement, save: (v: number | null) => void) => void;
}) {
  const f = props.field;
  const id = `setting-${f.wire.replace(/_/g, '-')}`;
  const def = () => (f.wire === 'seed' ? undefined : props.model?.shoal?.sampling_defaults?.[f.wire]);
  const problem = () => unreadable()[f.key] ?? samplingProblem(f, props.conv.settings[f.key]);
  const note = () => {
    if (f.wire === 'seed') return 'default: none, a new random draw each reply';
    const d = def();
    if (!d) return "default: the model's";
    return `default ${d.value}${d.value === f.off ? ' (off)' : ''} · ${d.source}`;
  };
  return (
    <label class="field">
      <span title={f.hint}>{f.label}</span>
      <input
        data-testid={id}
        type="number"
        min={f.min}
        max={Number.isFinite(f.max) ? f.max : undefined}
        step={f.step}
        placeholder={def() ? `model default ${def()!.value}` : f.wire === 'seed' ? 'random' : 'model default'}
        title={f.hint}
        data-default={def()?.value ?? ''}
        data-default-source={def()?.source ?? ''}
        value={untrack(() => props.conv.settings[f.key]) ?? ''}
        aria-invalid={problem() ? 'true' : 'false'}
        onInput={(e) => props.onNumber(f.key, f.label, e.currentTarget, (v) => updateSettings({ [f.key]: v }))}
      />
      <span class="muted small field-note" data-testid={`${id}-default`}>
        {note()}
      </span>
      <Show when={problem()}>
        <span class="error-text small" role="alert" data-testid={`${id}-error`}>
          {problem()}
        </span>
      </Show>
    </label>
  );
}
