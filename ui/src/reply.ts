// A reply's shape over time: Continue adds a step to it (the steps' texts are the reply's
// text, each step keeps the usage of its own request), Regenerate and Edit add a version
// (the older ones stay, each with its steps and usage, and the user's words it answered
// when those were edited since). A message shows one version: its text is the whole
// version's, the fields beside it are its last step's, its earlier steps are in `steps`.
import type { Message, ReplyStep, ReplyVersion } from './message';

/** The fields of a message that are its last step's. */
const STEP_KEYS = ['reasoning', 'responseId', 'model', 'finish', 'stopSequence', 'error', 'stats', 'created', 'tools', 'turn'] as const;
type StepKey = (typeof STEP_KEYS)[number];

function setKey<K extends StepKey>(to: Pick<Message, StepKey>, from: Pick<ReplyStep, StepKey>, k: K): void {
  if (from[k] === undefined) delete to[k];
  else to[k] = from[k] as Message[K];
}

/** The shown version's last step, as its own. */
export function lastStep(m: Message): ReplyStep {
  const before = (m.steps ?? []).reduce((n, s) => n + s.content.length, 0);
  const step: ReplyStep = { content: m.content.slice(before) };
  for (const k of STEP_KEYS) setKey(step, m, k);
  return step;
}

/** Every step of the shown version, the last one included. */
export function stepsOf(m: Message): ReplyStep[] {
  return [...(m.steps ?? []), lastStep(m)];
}

/** The shown version as it is kept. */
export function shownVersion(m: Message): ReplyVersion {
  const v: ReplyVersion = { version: m.version ?? 0, steps: stepsOf(m) };
  if (m.answered !== undefined) v.answered = m.answered;
  return v;
}

/** Every version of the reply, oldest first. */
export function allVersions(m: Message): ReplyVersion[] {
  return [...(m.versions ?? []), shownVersion(m)].sort((a, b) => a.version - b.version);
}

/** Puts `v` on the message as the version it shows. */
export function applyVersion(m: Message, v: ReplyVersion): void {
  const last = v.steps[v.steps.length - 1] ?? { content: '' };
  m.content = v.steps.map((s) => s.content).join('');
  for (const k of STEP_KEYS) setKey(m, last, k);
  if (v.steps.length > 1) m.steps = v.steps.slice(0, -1);
  else delete m.steps;
  m.version = v.version;
  if (v.answered !== undefined) m.answered = v.answered;
  else delete m.answered;
}

/** Shows version `n` of the reply (the others stay kept). */
export function switchVersion(m: Message, n: number): void {
  const all = allVersions(m);
  const v = all.find((x) => x.version === n);
  if (!v || n === (m.version ?? 0)) return;
  m.versions = all.filter((x) => x.version !== n);
  applyVersion(m, v);
}

/** Whether the shown version is the newest, where new steps go. */
export function showsNewest(m: Message): boolean {
  return (m.versions ?? []).every((v) => v.version < (m.version ?? 0));
}

/** Starts a new step of the shown version (Continue): the current step becomes an earlier one. */
export function beginStep(m: Message): void {
  m.steps = stepsOf(m);
  for (const k of STEP_KEYS) delete m[k];
  m.created = Date.now();
}

/**
 * Starts a new, empty version (Regenerate, Edit); the shown one is kept with the
 * others, remembering `answered` (the user's words before an edit) unless it already
 * answered earlier words.
 */
export function beginVersion(m: Message, answered?: string): void {
  const all = allVersions(m);
  const cur = shownVersion(m);
  if (answered !== undefined && cur.answered === undefined) cur.answered = answered;
  const next = Math.max(...all.map((v) => v.version)) + 1;
  m.versions = [...all.filter((v) => v.version !== cur.version), cur];
  applyVersion(m, { version: next, steps: [{ content: '', created: Date.now() }] });
}

/** One step of a version, where the store keeps it. */
export interface Part {
  version: number;
  step: number;
  part: ReplyStep;
  answered?: string;
}

/** The reply's steps in the store's order: by version, then step. */
export function partsOf(m: Message): Part[] {
  return allVersions(m).flatMap((v) =>
    v.steps.map((part, step) => ({ version: v.version, step, part, ...(v.answered !== undefined ? { answered: v.answered } : {}) })),
  );
}
