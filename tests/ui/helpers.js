// Shared pieces of the browser tests: Debian's chromium through playwright-core,
// the server under test (SHOAL_URL, started by tests/run-ui.sh), screenshots.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
export const BASE = (process.env.SHOAL_URL || '').replace(/\/$/, '');
/** A second server that requires an API key (tests/run-ui.sh), and its key; empty when not started. */
export const KEYED_BASE = (process.env.SHOAL_UI_KEYED_URL || '').replace(/\/$/, '');
export const KEY = process.env.SHOAL_UI_KEY || '';
export const ARTIFACTS = process.env.UI_ARTIFACTS || resolve(here, '..', '..', 'target', 'ui-artifacts');
export const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
export const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
];

if (!BASE) throw new Error('SHOAL_URL is not set: run the suite through tests/run-ui.sh');
mkdirSync(ARTIFACTS, { recursive: true });

export function launch() {
  return chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS });
}

/**
 * A fresh browser context (own localStorage) and page; conversations come from
 * the server's store, shared by every page. `setup(page)` runs before the
 * first navigation (e.g. to route requests). Uncaught page errors are
 * collected in `errors`; a test ends by asserting there were none.
 */
export async function openPage(
  browser,
  { width = 1280, height = 800, colorScheme = 'light', path = '/', setup, base = BASE, modelTitles = false } = {},
) {
  // Copy buttons write the clipboard; the tests read it back.
  const context = await browser.newContext({ viewport: { width, height }, colorScheme, permissions: ['clipboard-read', 'clipboard-write'] });
  // Titles written by the model are one more request after each chat's first reply: on for
  // the tests of them, off for the rest, whose chats keep their first message as title.
  await context.addInitScript((v) => {
    if (localStorage.getItem('shoal.modelTitles') == null) localStorage.setItem('shoal.modelTitles', v);
  }, modelTitles ? 'on' : 'off');
  const page = await context.newPage();
  page.setDefaultTimeout(30_000);
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  if (setup) await setup(page);
  await page.goto(base + path);
  return { context, page, errors };
}

export async function screenshot(page, name) {
  await page.screenshot({ path: join(ARTIFACTS, `${name}.png`) });
}

/**
 * Runs `body(page)` on a page `openPage` opened, screenshots it (on failure,
 * and on success unless `shot` is false), closes it, and checks no script
 * error escaped.
 */
export async function usePage({ context, page, errors }, name, body, { shot = true } = {}) {
  try {
    await body(page);
    if (shot) await screenshot(page, name);
  } catch (e) {
    await screenshot(page, `${name}-failed`).catch(() => {});
    throw e;
  } finally {
    await context.close();
  }
  assert.deepEqual(errors, [], 'uncaught errors in the page');
}

/** A request to the server under test (or to `base`, with `key` as a Bearer token). */
export async function api(path, body, method = body === undefined ? 'GET' : 'POST', { base = BASE, key } = {}) {
  const headers = {};
  if (body !== undefined) headers['content-type'] = 'application/json';
  if (key) headers.authorization = `Bearer ${key}`;
  const res = await fetch(base + path, body === undefined ? { method, headers } : { method, headers, body: JSON.stringify(body) });
  const text = await res.text();
  return { status: res.status, text, json: (() => { try { return JSON.parse(text); } catch { return null; } })() };
}

/** Sends a chat request with stream: true and returns the parsed chunks, content and final usage. */
export async function streamChat(body, base = BASE) {
  const res = await fetch(base + '/v1/chat/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  if (!res.ok) throw new Error(`POST /v1/chat/completions: ${res.status} ${await res.text()}`);
  const text = await res.text();
  const chunks = text
    .split('\n')
    .filter((l) => l.startsWith('data: ') && l !== 'data: [DONE]')
    .map((l) => JSON.parse(l.slice(6)));
  const content = chunks.map((c) => c.choices?.[0]?.delta?.content ?? '').join('');
  const usage = chunks.find((c) => c.usage)?.usage;
  const finish = chunks.map((c) => c.choices?.[0]?.finish_reason).find(Boolean);
  return { id: chunks[0]?.id, chunks, content, usage, finish };
}

/** The server's ledger entry for one response id (waits for it to be recorded). */
export async function ledgerEntry(id, timeoutMs = 5000, opts = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { json } = await api('/v1/usage?limit=200', undefined, 'GET', opts);
    const hit = json?.data?.find((e) => e.id === id);
    if (hit) return hit;
    if (Date.now() > deadline) throw new Error(`no ledger entry for ${id}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/**
 * Starts a new chat with the given settings (temperature 0 unless told
 * otherwise) and leaves the settings panel open.
 */
export async function newChat(page, { temperature = '0', maxTokens = '', stop = '', system = '', reasoning = false } = {}) {
  await page.getByTestId('model-picker').locator('option').first().waitFor({ state: 'attached' });
  await page.waitForFunction(() => document.querySelector('[data-testid=model-picker]')?.value);
  // In a narrow window the chat list is a drawer behind the ☰ button.
  if (page.viewportSize().width <= 720) await page.getByTestId('sidebar-toggle').click();
  await page.getByTestId('new-chat').click();
  if ((await page.getByTestId('settings-panel').count()) === 0) await page.getByTestId('settings-toggle').click();
  await page.getByTestId('setting-temperature').fill(temperature);
  await page.getByTestId('setting-max-tokens').fill(maxTokens);
  await page.getByTestId('setting-stop').fill(stop);
  await page.getByTestId('setting-system').fill(system);
  await page.getByTestId('setting-reasoning').setChecked(reasoning);
}

/** Types a message and presses Enter; resolves with the chat request body the UI sent. */
export async function send(page, text) {
  await page.getByTestId('composer-input').fill(text);
  const req = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions') && r.method() === 'POST');
  await page.getByTestId('composer-input').press('Enter');
  return JSON.parse((await req).postData());
}

export function lastReply(page) {
  return page.getByTestId('message-assistant').last();
}

/**
 * Waits for the last reply's finish badge and, unless `saved` is false, for
 * the reply to be written to the server's store; returns its finish reason.
 */
export async function waitFinish(page, timeout = 120_000, { saved = true } = {}) {
  const reply = lastReply(page);
  const badge = reply.getByTestId('finish-badge');
  await badge.waitFor({ timeout });
  if (saved) {
    await page.waitForFunction(
      () => [...document.querySelectorAll('[data-testid=message-assistant]')].pop()?.dataset.saved !== 'pending',
      null,
      { timeout: 15_000 },
    );
    const state = await reply.getAttribute('data-saved');
    if (state !== 'saved') {
      const why = await page.getByTestId('store-error').innerText().catch(() => '(no store error shown)');
      throw new Error(`the reply was not saved (${state}): ${why}`);
    }
  }
  return badge.getAttribute('data-finish');
}

/** The server id of the conversation shown (the active one in the list). */
export async function currentServerId(page) {
  const item = page.locator('[data-testid=conversation-item].active');
  await page.waitForFunction(() => document.querySelector('[data-testid=conversation-item].active')?.dataset.serverId);
  return Number(await item.getAttribute('data-server-id'));
}

/** One conversation as the server's store has it (GET /v1/conversations), or undefined. */
export async function storedConversation(id, base = BASE) {
  const { status, text, json } = await api('/v1/conversations', undefined, 'GET', { base });
  if (status !== 200) throw new Error(`GET /v1/conversations: ${status} ${text}`);
  return json.data.find((c) => c.id === id);
}

/** The figures shown under a reply, as numbers (null when shown as "—"). */
export async function shownStats(reply) {
  return reply.getByTestId('reply-usage').evaluate((el) => {
    const v = (id) => {
      const raw = el.querySelector(`[data-testid=usage-${id}]`)?.getAttribute('data-value');
      return raw === '' || raw == null ? null : Number(raw);
    };
    return {
      live: el.getAttribute('data-live') === 'true',
      source: el.getAttribute('data-source'),
      prompt: v('prompt'),
      cached: v('cached'),
      completion: v('completion'),
      reasoning: v('reasoning'),
      total: v('total'),
      ttft: v('ttft'),
      tps: v('tps'),
    };
  });
}

/** Usage figures of an OpenAI usage object in the shape of `shownStats`. */
export function usageFigures(u) {
  return {
    prompt: u.prompt_tokens,
    cached: u.prompt_tokens_details?.cached_tokens ?? 0,
    completion: u.completion_tokens,
    reasoning: u.completion_tokens_details?.reasoning_tokens ?? 0,
    total: u.total_tokens,
  };
}

/**
 * Records, in the page, every state the last reply goes through (content
 * length, live flag, completion count) so a test can check it streamed.
 */
export async function traceReplies(page) {
  await page.evaluate(() => {
    window.__trace = [];
    const snap = () => {
      const replies = document.querySelectorAll('[data-testid=message-assistant]');
      const r = replies[replies.length - 1];
      if (!r) return;
      const usage = r.querySelector('[data-testid=reply-usage]');
      const s = {
        len: r.querySelector('[data-testid=assistant-content]')?.textContent.length ?? 0,
        live: usage?.getAttribute('data-live') === 'true',
        completion: Number(usage?.querySelector('[data-testid=usage-completion]')?.getAttribute('data-value') || 0),
      };
      const last = window.__trace[window.__trace.length - 1];
      if (!last || last.len !== s.len || last.live !== s.live || last.completion !== s.completion) window.__trace.push(s);
    };
    new MutationObserver(snap).observe(document.body, { subtree: true, childList: true, characterData: true, attributes: true });
  });
  return () => page.evaluate(() => window.__trace);
}

/**
 * Starts a server of the test's own (`shoal serve --port 0` plus `args`,
 * the model from the environment) and waits for its listening line;
 * resolves with its URL and process. The caller stops it. Its prefix cache
 * is off (so are its files on disk) unless `prefixCacheMb` says otherwise.
 */
export function startServer(args, { prefixCacheMb = 0 } = {}) {
  const bin = process.env.SHOAL_BIN;
  if (!bin) throw new Error('SHOAL_BIN is not set: run the suite through tests/run-ui.sh');
  const proc = spawn(bin, ['serve', '--port', '0', '--prefix-cache-mb', String(prefixCacheMb), ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  proc.stderr.on('data', (d) => (err = (err + d).slice(-4000)));
  return new Promise((resolveUrl, reject) => {
    let out = '';
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/^shoal listening on (http:\/\/\S+) /m);
      if (m) resolveUrl({ url: m[1], proc });
    });
    proc.on('exit', (code) => reject(new Error(`shoal serve exited (${code}) before listening: ${err}`)));
  });
}

/**
 * Stops a server started by `startServer` with SIGTERM, as a service manager
 * does, and waits for it to exit: a graceful stop lets the prefix cache's
 * last writes land first.
 */
export function stopServer(proc) {
  return new Promise((done) => {
    if (proc.exitCode !== null || proc.signalCode !== null) return done(proc.exitCode);
    proc.once('exit', (code) => done(code));
    proc.kill('SIGTERM');
  });
}

/** Kills a server started by `startServer` with SIGKILL and waits for it to be gone. */
export function killServer(proc) {
  return new Promise((done) => {
    if (proc.exitCode !== null || proc.signalCode !== null) return done();
    proc.once('exit', () => done());
    proc.kill('SIGKILL');
  });
}
