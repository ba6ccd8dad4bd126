import { createSignal, ErrorBoundary, For, Match, onCleanup, onMount, Switch } from 'solid-js';
import { ForgetKeyButton, KeyPrompt } from './components/KeyPrompt';
import { ChatView } from './views/Chat';
import { ClusterView } from './views/Cluster';
import { ServerView } from './views/Server';
import { UsageView } from './views/Usage';
import { ErrorBanner } from './components/ErrorBanner';
import { applyTheme, nextTheme, savedTheme, type Theme } from './theme';

type Route = 'chat' | 'usage' | 'cluster' | 'server';

const ROUTES: { id: Route; label: string; path: string }[] = [
  { id: 'chat', label: 'Chat', path: '/' },
  { id: 'usage', label: 'Usage', path: '/usage' },
  { id: 'cluster', label: 'Cluster', path: '/cluster' },
  { id: 'server', label: 'Server', path: '/server' },
];

function routeOf(path: string): Route {
  if (path.startsWith('/usage')) return 'usage';
  if (path.startsWith('/cluster')) return 'cluster';
  if (path.startsWith('/server')) return 'server';
  return 'chat';
}

export function App() {
  const [route, setRoute] = createSignal<Route>(routeOf(location.pathname));
  const [theme, setTheme] = createSignal<Theme>(savedTheme());

  const go = (r: Route, e?: MouseEvent) => {
    if (e && (e.metaKey || e.ctrlKey || e.shiftKey || e.button !== 0)) return;
    e?.preventDefault();
    const path = ROUTES.find((x) => x.id === r)!.path;
    if (location.pathname !== path) history.pushState(null, '', path);
    setRoute(r);
  };
  const onPop = () => setRoute(routeOf(location.pathname));
  onMount(() => window.addEventListener('popstate', onPop));
  onCleanup(() => window.removeEventListener('popstate', onPop));

  const toggleTheme = () => {
    const t = nextTheme(theme());
    setTheme(t);
    applyTheme(t);
  };

  return (
    <div class="app" data-testid="app">
      <header class="topbar">
        <a class="brand" href="/" onClick={(e) => go('chat', e)}>
          <svg viewBox="0 0 16 16" width="18" height="18" aria-hidden="true">
            <circle cx="5" cy="9" r="3" fill="#3b82f6" />
            <circle cx="11" cy="7" r="3" fill="#06b6d4" />
          </svg>
          Shoal
        </a>
        <nav class="tabs">
          <For each={ROUTES}>
            {(r) => (
              <a
                href={r.path}
                class="tab"
                classList={{ active: route() === r.id }}
                aria-current={route() === r.id ? 'page' : undefined}
                data-testid={`nav-${r.id}`}
                onClick={(e) => go(r.id, e)}
              >
                {r.label}
              </a>
            )}
          </For>
        </nav>
        <ForgetKeyButton />
        <button
          class="icon-btn"
          data-testid="theme-toggle"
          data-theme-choice={theme()}
          title={`Theme: ${theme()} (click to change)`}
          aria-label={`Theme: ${theme()}`}
          onClick={toggleTheme}
        >
          {theme() === 'dark' ? '☾' : theme() === 'light' ? '☀' : '◐'}
        </button>
      </header>
      <main class="content">
        <ErrorBoundary
          fallback={(err, reset) => (
            <ErrorBanner testid="app-error" action={{ label: 'Try again', onClick: reset }}>
              Something went wrong showing this page: {String(err?.message ?? err)}
            </ErrorBanner>
          )}
        >
          <Switch>
            <Match when={route() === 'chat'}>
              <ChatView />
            </Match>
            <Match when={route() === 'usage'}>
              <UsageView />
            </Match>
            <Match when={route() === 'cluster'}>
              <ClusterView />
            </Match>
            <Match when={route() === 'server'}>
              <ServerView />
            </Match>
          </Switch>
        </ErrorBoundary>
      </main>
      <KeyPrompt />
    </div>
  );
}
