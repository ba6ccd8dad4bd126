// The web UI against a server that requires an API key (tests/run-ui.sh starts
// it beside the open one: SHOAL_UI_KEYED_URL, key in SHOAL_UI_KEY): the key
// prompt, a wrong key, the right key unlocking chat / usage / cluster, reload,
// "Forget key", and the key kept out of the page's text, URL and console.
// The last test checks the open server never asks for a key.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, test } from 'node:test';
import {
  api,
  KEY,
  KEYED_BASE,
  launch,
  lastReply,
  ledgerEntry,
  newChat,
  openPage,
  usePage,
  screenshot,
  send,
  shownStats,
  usageFigures,
  waitFinish,
} from './helpers.js';

// Greedy, the default model answers this in one sentence on both backends.
const FRANCE = 'What is the capital of France? Answer in one sentence.';
const skip = !KEYED_BASE || !KEY ? 'no keyed server (SHOAL_UI_KEYED_URL / SHOAL_UI_KEY): run through tests/run-ui.sh' : false;
const keyed = { base: KEYED_BASE, key: KEY };

let browser;

before(async () => {
  browser = await launch();
});

after(async () => {
  await browser?.close();
});

/**
 * A fresh page on `base`; collects the page's console lines and every API
 * request's authorization header. Screenshots it (also on failure), closes
 * it and checks no script error escaped.
 */
async function withKeyedPage(name, opts, body) {
  const consoleLines = [];
  const apiRequests = [];
  const opened = await openPage(browser, {
    base: KEYED_BASE,
    ...opts,
    setup: async (p) => {
      p.on('console', (m) => consoleLines.push(m.text()));
      p.on('request', (r) => {
        const u = new URL(r.url());
        if (u.pathname.startsWith('/v1/')) apiRequests.push({ path: u.pathname, method: r.method(), authorization: r.headers().authorization ?? null });
      });
    },
  });
  await usePage(opened, name, (page) => body(page, { consoleLines, apiRequests }));
  assert.ok(!consoleLines.some((l) => l.includes(KEY)), 'the key is in a console line');
}

const prompt = (page) => page.getByTestId('key-prompt');
const storedKey = (page) => page.evaluate(() => localStorage.getItem('shoal.apiKey'));

async function enterKey(page, key) {
  await page.getByTestId('key-input').fill(key);
  await page.getByTestId('key-submit').click();
}

/** The key nowhere in what the page shows, its markup or its address. */
async function assertKeyHidden(page) {
  const { text, html, url } = await page.evaluate(() => ({
    text: document.body.innerText,
    html: document.documentElement.outerHTML,
    url: location.href,
  }));
  assert.ok(!text.includes(KEY), 'the key is in the page text');
  assert.ok(!html.includes(KEY), 'the key is in the page markup');
  assert.ok(!url.includes(KEY), 'the key is in the URL');
  assert.ok(!page.url().includes(KEY), 'the key is in the URL');
}

test('with a key configured the API answers 401 without it, the UI files and /health stay open', { skip }, async () => {
  const root = await fetch(KEYED_BASE + '/', { headers: { accept: 'text/html' } });
  assert.equal(root.status, 200);
  assert.match(await root.text(), /<div id="root">/);
  assert.equal((await fetch(KEYED_BASE + '/health')).status, 200);
  const bare = await api('/v1/models', undefined, 'GET', { base: KEYED_BASE });
  assert.equal(bare.status, 401, bare.text);
  assert.equal(bare.json?.error?.type, 'authentication_error');
  const wrong = await api('/v1/models', undefined, 'GET', { base: KEYED_BASE, key: `wrong-${KEY}` });
  assert.equal(wrong.status, 401);
  const ok = await api('/v1/models', undefined, 'GET', keyed);
  assert.equal(ok.status, 200, ok.text);
  assert.ok(ok.json.data.length >= 1);
});

test('the key prompt: shown on load, a wrong key refused with the server\'s message, the right key unlocks the chat, reload keeps it, "Forget key" asks again', { skip }, async () => {
  await withKeyedPage('key-flow', {}, async (page, { apiRequests }) => {
    // On load: the prompt, a password field, and nothing loaded behind it.
    await prompt(page).waitFor();
    assert.match(await prompt(page).innerText(), /This server requires an API key/);
    assert.equal(await page.getByTestId('key-input').getAttribute('type'), 'password');
    assert.equal(await page.getByTestId('key-error').count(), 0, 'no error before a key was tried');
    assert.equal(await page.getByTestId('forget-key').count(), 0);
    assert.equal(await page.getByTestId('conversation-list').getAttribute('data-loaded'), 'false');
    assert.equal(await page.getByTestId('app-error').count(), 0);
    await screenshot(page, 'key-prompt');

    // A wrong key: the server's own message, asked again, nothing kept.
    await enterKey(page, `wrong-${randomBytes(8).toString('hex')}`);
    await page.getByTestId('key-error').waitFor();
    assert.match(await page.getByTestId('key-error').innerText(), /invalid API key/);
    assert.ok(await prompt(page).isVisible());
    assert.equal(await page.getByTestId('key-input').inputValue(), '', 'the field is cleared for another try');
    assert.equal(await storedKey(page), null);
    assert.equal(await page.getByTestId('forget-key').count(), 0);
    await screenshot(page, 'key-wrong');

    // The right key: the prompt goes, the waiting requests go through with it.
    await enterKey(page, KEY);
    await prompt(page).waitFor({ state: 'detached' });
    assert.equal(await storedKey(page), KEY, 'kept in localStorage');
    await page.waitForFunction(() => document.querySelector('[data-testid=conversation-list]')?.dataset.loaded === 'true');
    await page.getByTestId('forget-key').waitFor();
    await assertKeyHidden(page);

    // A chat: streamed reply, usage badge equal to the ledger read with the key.
    await newChat(page);
    const body = await send(page, FRANCE);
    assert.equal(body.stream, true);
    assert.equal(await waitFinish(page), 'stop');
    const reply = lastReply(page);
    assert.equal((await reply.getByTestId('assistant-content').innerText()).trim(), 'The capital of France is Paris.');
    const shown = await shownStats(reply);
    assert.equal(shown.live, false);
    assert.equal(shown.source, 'stream');
    const id = await reply.getAttribute('data-response-id');
    assert.match(id, /^chatcmpl-/);
    const entry = await ledgerEntry(id, 5000, keyed);
    const want = usageFigures(entry.usage);
    assert.deepEqual(
      { prompt: shown.prompt, cached: shown.cached, completion: shown.completion, reasoning: shown.reasoning, total: shown.total },
      want,
    );
    assert.ok(want.completion > 0 && want.prompt > 0, JSON.stringify(want));
    // Saved in the keyed server's store (the store's writes carry the key too).
    const convs = await api('/v1/conversations', undefined, 'GET', keyed);
    assert.equal(convs.status, 200, convs.text);
    const stored = convs.json.data.find((c) => c.messages?.some((m) => m.pieces?.[0]?.metadata?.response_id === id));
    assert.ok(stored, 'the reply is in the keyed server\'s conversation store');
    await assertKeyHidden(page);

    // Every API request after the key was entered carried it; before, none did.
    const firstKeyed = apiRequests.findIndex((r) => r.authorization === `Bearer ${KEY}`);
    assert.ok(firstKeyed >= 0, 'no request carried the key');
    const after = apiRequests.slice(firstKeyed).filter((r) => r.authorization !== `Bearer ${KEY}`);
    assert.deepEqual(after, [], `requests without the key after it was entered: ${JSON.stringify(after.map((r) => `${r.method} ${r.path}`))}`);
    assert.ok(apiRequests.some((r) => r.path === '/v1/chat/completions' && r.authorization === `Bearer ${KEY}`));
    assert.ok(apiRequests.some((r) => r.path.startsWith('/v1/conversations') && r.method === 'POST' && r.authorization === `Bearer ${KEY}`));

    // Reload: no prompt, the conversation is back from the store.
    await page.reload();
    await page.waitForFunction(() => document.querySelector('[data-testid=conversation-list]')?.dataset.loaded === 'true');
    await page.waitForFunction((rid) => !!document.querySelector(`[data-testid=message-assistant][data-response-id="${rid}"]`), id);
    assert.equal(await prompt(page).count(), 0, 'asked again after a reload');

    // The polled views work with the key.
    await page.getByTestId('nav-usage').click();
    await page.locator(`[data-testid=usage-row][data-id="${id}"]`).waitFor({ timeout: 10_000 });
    await page.getByTestId('nav-cluster').click();
    await page.locator('[data-testid=node-card][data-self=true]').waitFor();
    assert.equal(await page.getByTestId('cluster-error').count(), 0);
    assert.equal(await prompt(page).count(), 0);

    // A narrow window still fits with the key's button in the header.
    await page.setViewportSize({ width: 400, height: 800 });
    assert.ok(await page.getByTestId('forget-key').isVisible());
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth), 'no horizontal scrolling at 400px');
    await screenshot(page, 'key-narrow');
    await page.setViewportSize({ width: 1280, height: 800 });
    await assertKeyHidden(page);

    // Forget key: dropped from the browser, the page reloads and asks again.
    await page.getByTestId('nav-chat').click();
    await Promise.all([page.waitForEvent('load'), page.getByTestId('forget-key').click()]);
    await prompt(page).waitFor();
    assert.equal(await storedKey(page), null);
    assert.equal(await page.getByTestId('forget-key').count(), 0);
    assert.equal(await page.getByTestId('key-error').count(), 0);
    await assertKeyHidden(page);
  });
});

test('a kept key the server no longer accepts: the prompt says so, drops it and takes the right one', { skip }, async () => {
  await withKeyedPage('key-stale', {}, async (page) => {
    await prompt(page).waitFor();
    await page.evaluate(() => localStorage.setItem('shoal.apiKey', 'a-key-from-before'));
    await page.reload();
    await page.getByTestId('key-error').waitFor();
    assert.match(await page.getByTestId('key-error').innerText(), /invalid API key/);
    assert.equal(await storedKey(page), null, 'the refused key is dropped');
    await enterKey(page, `  ${KEY}  `);
    await prompt(page).waitFor({ state: 'detached' });
    assert.equal(await storedKey(page), KEY, 'kept without the spaces around it');
    await page.getByTestId('model-picker').locator('option').first().waitFor({ state: 'attached' });
    await page.waitForFunction(() => document.querySelector('[data-testid=conversation-list]')?.dataset.loaded === 'true');
    await assertKeyHidden(page);
  });
});

test('a chat request refused for its key waits for the prompt: Esc cancels it, a key entered sends the others again', { skip }, async () => {
  await withKeyedPage('key-wait', {}, async (page) => {
    await prompt(page).waitFor();
    await enterKey(page, KEY);
    await prompt(page).waitFor({ state: 'detached' });
    // The server "changes its key" for the chat route only: its request is refused.
    await page.route('**/v1/chat/completions', (route) =>
      route.fulfill({
        status: 401,
        contentType: 'application/json',
        body: JSON.stringify({ error: { message: 'invalid API key', type: 'authentication_error', code: 'unauthorized' } }),
      }),
    );
    await newChat(page);
    await send(page, FRANCE);
    await page.getByTestId('key-error').waitFor();
    assert.match(await page.getByTestId('key-error').innerText(), /invalid API key/);
    assert.equal(await storedKey(page), null, 'the refused key is dropped');
    // The reply waits (not an error); Esc stops it like any reply.
    assert.equal(await lastReply(page).getByTestId('finish-badge').count(), 0);
    await page.keyboard.press('Escape');
    assert.equal(await waitFinish(page, 15_000, { saved: false }), 'cancelled');
    // The store's writes wait for the key too, then go through with it.
    await page.unroute('**/v1/chat/completions');
    await enterKey(page, KEY);
    await prompt(page).waitFor({ state: 'detached' });
    await page.waitForFunction(
      () => [...document.querySelectorAll('[data-testid=message-assistant]')].pop()?.dataset.saved === 'saved',
      null,
      { timeout: 15_000 },
    );
    await newChat(page);
    await send(page, FRANCE);
    assert.equal(await waitFinish(page), 'stop');
    assert.equal((await lastReply(page).getByTestId('assistant-content').innerText()).trim(), 'The capital of France is Paris.');
    assert.equal(await prompt(page).count(), 0);
  });
});

test('the open server never asks for a key and the UI sends none', async () => {
  const auth = [];
  const { context, page, errors } = await openPage(browser, {
    setup: async (p) => p.on('request', (r) => new URL(r.url()).pathname.startsWith('/v1/') && auth.push(r.headers().authorization ?? null)),
  });
  try {
    await page.waitForFunction(() => document.querySelector('[data-testid=conversation-list]')?.dataset.loaded === 'true');
    await page.getByTestId('model-picker').locator('option').first().waitFor({ state: 'attached' });
    await page.getByTestId('nav-usage').click();
    await page.getByTestId('usage-updated').filter({ hasText: 'updated' }).waitFor();
    assert.equal(await prompt(page).count(), 0);
    assert.equal(await page.getByTestId('forget-key').count(), 0);
    assert.ok(auth.length >= 3, `saw ${auth.length} API requests`);
    assert.deepEqual(auth.filter((a) => a !== null), [], 'an Authorization header was sent to the open server');
  } finally {
    await context.close();
  }
  assert.deepEqual(errors, []);
});
