import { Show } from 'solid-js';
import { FINISH, type Finish } from '../finish';

/**
 * Why a reply ended, with a tooltip saying what it means and what to do; for
 * a stop sequence, the sequence that matched (newlines and tabs shown escaped).
 */
export function FinishBadge(props: { finish: Finish; stopSequence?: string }) {
  const info = () => FINISH[props.finish];
  const seq = () => (props.finish === 'stop_sequence' && props.stopSequence ? props.stopSequence : null);
  const shown = () => JSON.stringify(seq() ?? '');
  const help = () => (seq() != null ? `Matched ${shown()}. ${info().help}` : info().help);
  return (
    <span
      class={`badge ${info().tone}`}
      data-testid="finish-badge"
      data-finish={props.finish}
      data-stop-sequence={seq() ?? undefined}
      title={help()}
      tabIndex={0}
      aria-label={`${info().label}: ${help()}`}
    >
      {info().label}
      <Show when={seq() != null}>
        {' '}
        <code class="badge-seq" data-testid="finish-stop-sequence">
          {shown()}
        </code>
      </Show>
    </span>
  );
}
