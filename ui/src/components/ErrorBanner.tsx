import { Show, type JSX } from 'solid-js';

/** A way out of an error: Retry, Dismiss, Try again. */
export interface BannerAction {
  label: string;
  title?: string;
  onClick: () => void;
}

/** An error across the page, announced to screen readers, with an optional action. */
export function ErrorBanner(props: { testid: string; action?: BannerAction; children: JSX.Element }) {
  return (
    <div class="banner error" role="alert" data-testid={props.testid}>
      {props.children}
      <Show when={props.action}>
        {(a) => (
          <>
            {' '}
            <button class="btn small" title={a().title} onClick={() => a().onClick()}>
              {a().label}
            </button>
          </>
        )}
      </Show>
    </div>
  );
}
