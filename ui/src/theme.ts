// Light / dark: follows prefers-color-scheme unless the toggle picked one.
// `data-theme` holds the choice (absent for "system"); `data-scheme` holds
// the scheme in force, so the stylesheet spells the dark palette once.
export type Theme = 'system' | 'light' | 'dark';
const KEY = 'shoal.theme';
const DARK = '(prefers-color-scheme: dark)';

export function savedTheme(): Theme {
  try {
    const t = localStorage.getItem(KEY);
    return t === 'light' || t === 'dark' ? t : 'system';
  } catch {
    return 'system';
  }
}

function resolveScheme(): void {
  const root = document.documentElement;
  const choice = root.dataset.theme;
  root.dataset.scheme =
    choice === 'light' || choice === 'dark' ? choice : window.matchMedia(DARK).matches ? 'dark' : 'light';
}

let following = false;

export function applyTheme(t: Theme): void {
  const root = document.documentElement;
  if (t === 'system') delete root.dataset.theme;
  else root.dataset.theme = t;
  resolveScheme();
  if (!following) {
    following = true;
    window.matchMedia(DARK).addEventListener('change', resolveScheme);
  }
  try {
    if (t === 'system') localStorage.removeItem(KEY);
    else localStorage.setItem(KEY, t);
  } catch {
    /* storage unavailable */
  }
}

export function nextTheme(t: Theme): Theme {
  return t === 'system' ? 'light' : t === 'light' ? 'dark' : 'system';
}
