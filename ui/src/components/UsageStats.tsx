import { createSignal, Show } from 'solid-js';
import { fmtInt, fmtMs, fmtRate, fmtShare } from '../format';
import type { ReplyStats } from '../store';

/**
 * The quiet line under a reply: tokens, speed, time to the first token and
 * what the cache served, with no figure that is zero or does not apply.
 */
export function summary(s: ReplyStats): string {
  const parts = [`${fmtInt(s.completion)} tok`];
  if (s.tokPerS != null && s.tokPerS > 0) parts.push(`${fmtRate(s.tokPerS)} tok/s`);
  if (s.ttftMs != null && Number.isFinite(s.ttftMs)) parts.push(`${(s.ttftMs / 1000).toFixed(2)} s`);
  if (s.cached) parts.push(`${fmtInt(s.cached)} cached`);
  if (s.image) parts.push(`${fmtInt(s.image)} image tok`);
  return parts.join(' · ');
}

/**
 * Token counts and speed of one reply: a quiet line, and every figure one
 * click away. While streaming, completion is the number of deltas seen so
 * far (approximate); once the server's usage arrives every figure is
 * exactly what the API reported.
 */
export function UsageStats(props: { stats: ReplyStats }) {
  const s = () => props.stats;
  const [open, setOpen] = createSignal(false);
  /** A figure of the breakdown; one that is zero (or unknown) where zero is the rule is left out of sight. */
  const item = (id: string, label: string, value: number | null, text: string, hint: string, quietWhenZero = false) => (
    <span
      class="stat"
      classList={{ quiet: quietWhenZero && !value }}
      data-testid={`usage-${id}`}
      data-value={value ?? ''}
      title={hint}
    >
      <span class="muted">{label}</span> <b>{text}</b>
    </span>
  );
  return (
    <div
      class="stats"
      data-testid="reply-usage"
      data-live={s().live ? 'true' : 'false'}
      data-source={s().source}
      data-open={open() ? 'true' : 'false'}
    >
      <button
        type="button"
        class="stats-summary"
        data-testid="usage-summary"
        aria-expanded={open()}
        title={open() ? 'Hide the breakdown' : 'Every figure: prompt, cached, completion, reasoning, total, speed'}
        onClick={() => setOpen(!open())}
      >
        {summary(s())}
      </button>
      <Show when={s().live}>
        <span class="tag live" data-testid="usage-live" title="Counted from the stream so far: one per text delta. Replaced by the server's exact usage when the reply ends.">
          live ≈
        </span>
      </Show>
      <Show when={s().source === 'ledger'}>
        <span class="tag" data-testid="usage-recorded" title="The numbers the server recorded for this request in its usage log (the stream was stopped before its usage chunk, or another client stored the reply).">
          as recorded
        </span>
      </Show>
      <div class="stats-detail" data-testid="usage-detail" hidden={!open()}>
      {item('prompt', 'prompt', s().prompt, fmtInt(s().prompt), 'Prompt tokens')}
      {item(
        'cached',
        'cached',
        s().cached,
        s().cachedDisk ? `${fmtInt(s().cached)} (${fmtInt(s().cachedDisk)} from disk)` : fmtInt(s().cached),
        'Prompt tokens served from the prefix cache (in memory, or read back from its files on disk)',
        true,
      )}
      {item(
        'cache-hit',
        'cache hit',
        s().prompt ? (s().cached ?? 0) / s().prompt! : null,
        fmtShare(s().cached, s().prompt),
        'Cached ÷ prompt tokens: the share of the prompt the prefix cache served',
        true,
      )}
      {item(
        'completion',
        s().live ? 'completion ≈' : 'completion',
        s().completion,
        fmtInt(s().completion),
        s().live ? 'Live count of deltas received (approximate)' : 'Completion tokens (includes reasoning)',
      )}
      {item('reasoning', 'reasoning', s().reasoning, fmtInt(s().reasoning), 'Reasoning tokens (part of completion)', true)}
      {item('image', 'image', s().image ?? null, fmtInt(s().image ?? null), "Prompt tokens the prompt's images took (part of prompt)", true)}
      {item('total', 'total', s().total, fmtInt(s().total), 'Prompt + completion tokens')}
      {item(
        'ttft',
        'TTFT',
        s().ttftMs,
        fmtMs(s().ttftMs),
        s().live ? 'Time from send to the first delta (timed here)' : 'Time to the first token, as the server timed it',
      )}
      {item(
        'tps',
        'tok/s',
        s().tokPerS,
        fmtRate(s().tokPerS),
        s().live ? 'Deltas per second so far (timed here)' : 'Decode speed after the first token, as the server timed it',
      )}
      <Show when={s().drafts}>
        {(d) =>
          item(
            'drafts',
            'drafts kept',
            d().kept,
            `${fmtInt(d().kept)} / ${fmtInt(d().checked)}`,
            'Speculative decoding: draft tokens the model confirmed, of those it checked. Confirmed drafts are ordinary completion tokens that needed no step of their own; the rest were dropped and are not counted anywhere.',
          )
        }
      </Show>
      </div>
    </div>
  );
}
