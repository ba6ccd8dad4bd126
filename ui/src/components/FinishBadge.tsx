import { FINISH, type Finish } from '../finish';

/** Why a reply ended, with a tooltip saying what it means and what to do. */
export function FinishBadge(props: { finish: Finish }) {
  const info = () => FINISH[props.finish];
  return (
    <span
      class={`badge ${info().tone}`}
      data-testid="finish-badge"
      data-finish={props.finish}
      title={info().help}
      tabIndex={0}
      aria-label={`${info().label}: ${info().help}`}
    >
      {info().label}
    </span>
  );
}
