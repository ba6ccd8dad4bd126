// The web UI served by `shoal serve` at `/`, in Debian's chromium, against the
// real default model (greedy: temperature 0 in the chat settings).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  api,
  BASE,
  launch,
  lastReply,
  ledgerEntry,
  newChat,
  openPage,
  screenshot,
  send,
  shownStats,
  streamChat,
  traceReplies,
  usageFigures,
  waitFinish,
} from './helpers.js';

const FRANCE = 'What is the capital of France?';
const DRAGON = 'Write a long story about a dragon';

let browser;
let model;

before(async () => {
  const models = await api('/v1/models');
  assert.equal(models.status, 200, models.text);
  model = models.json.data[0].id;
  browser = await launch();
});

after(async () => {
  await browser?.close();
});

/** Runs `body` with a fresh page; screenshots it (also on failure) and checks no script error escaped. */
async function withPage(name, opts, body) {
  const { context, page, errors } = await openPage(browser, opts);
  try {
    await body(page);
    await screenshot(page, name);
  } catch (e) {
    await screenshot(page, `${name}-failed`).catch(() => {});
    throw e;
  } finally {
    await context.close();
  }
  assert.deepEqual(errors, [], 'uncaught errors in the page');
}

test('the binary serves the UI at / and unknown routes fall back to it', async () => {
  const root = await fetch(BASE + '/');
  assert.equal(root.status, 200);
  const html = await root.text();
  assert.match(html, /<div id="root">/, 'the binary was built without ui/dist');
  const deep = await fetch(BASE + '/usage');
  assert.equal(deep.status, 200);
  assert.equal(await deep.text(), html);
  const api404 = await fetch(BASE + '/v1/nope');
  assert.equal(api404.status, 404);
});

test('a reply streams token by token and its final usage equals the API usage', async () => {
  await withPage('chat-stream', {}, async (page) => {
    await newChat(page);
    const trace = await traceReplies(page);
    const body = await send(page, FRANCE);
    assert.equal(body.model, model);
    assert.equal(body.stream, true);
    assert.deepEqual(body.stream_options, { include_usage: true });
    assert.equal(body.temperature, 0);

    // Live while streaming: the stop button and an approximate count.
    await page.getByTestId('stop-button').waitFor();
    assert.equal(await waitFinish(page), 'stop');
    await page.getByTestId('send-button').waitFor();

    const reply = lastReply(page);
    assert.equal((await reply.getByTestId('assistant-content').innerText()).trim(), 'The capital of France is Paris.');
    const states = await trace();
    const liveStates = states.filter((s) => s.live && s.len > 0);
    assert.ok(
      new Set(liveStates.map((s) => s.len)).size >= 2,
      `expected the text to grow in several steps while live, saw ${JSON.stringify(states)}`,
    );
    assert.ok(liveStates.every((s) => s.completion >= 1 && s.completion <= 8), JSON.stringify(liveStates));

    // Final figures: exactly the usage the API reports for the same request.
    const shown = await shownStats(reply);
    assert.equal(shown.live, false);
    assert.equal(shown.source, 'stream');
    const again = await streamChat(body);
    assert.equal(again.content, 'The capital of France is Paris.');
    const want = usageFigures(again.usage);
    assert.deepEqual(
      { prompt: shown.prompt, cached: shown.cached, completion: shown.completion, reasoning: shown.reasoning, total: shown.total },
      want,
    );
    assert.deepEqual(want, { prompt: 37, cached: 0, completion: 8, reasoning: 0, total: 45 });
    // And what the server's ledger recorded for the UI's own request.
    const id = await reply.getAttribute('data-response-id');
    assert.match(id, /^chatcmpl-/);
    const entry = await ledgerEntry(id);
    assert.deepEqual(usageFigures(entry.usage), want);
    assert.ok(shown.ttft > 0, 'TTFT shown');
    assert.ok(shown.tps > 0, 'tok/s shown');
    assert.match(await reply.getByTestId('finish-badge').getAttribute('title'), /ended the reply itself/);
  });
});

test('max tokens 3 ends with the length badge', async () => {
  await withPage('badge-length', {}, async (page) => {
    await newChat(page, { maxTokens: '3' });
    const body = await send(page, 'Tell me a story');
    assert.equal(body.max_tokens, 3);
    assert.equal(await waitFinish(page), 'length');
    const badge = lastReply(page).getByTestId('finish-badge');
    assert.match(await badge.getAttribute('title'), /max tokens/i);
    const shown = await shownStats(lastReply(page));
    assert.equal(shown.completion, 3);
    const again = await streamChat(body);
    assert.equal(again.finish, 'length');
    assert.equal(shown.prompt, again.usage.prompt_tokens);
  });
});

test('a stop sequence ends with the stop-sequence badge', async () => {
  await withPage('badge-stop-sequence', {}, async (page) => {
    await newChat(page, { stop: 'Paris' });
    const body = await send(page, FRANCE);
    assert.deepEqual(body.stop, ['Paris']);
    assert.equal(await waitFinish(page), 'stop_sequence');
    const text = (await lastReply(page).getByTestId('assistant-content').innerText()).trim();
    assert.equal(text, 'The capital of France is');
    assert.match(await lastReply(page).getByTestId('finish-badge').getAttribute('title'), /stop sequence/i);

    // Without the stop sequence the same chat ends naturally: plain "stop".
    await page.getByTestId('setting-stop').fill('');
    await send(page, FRANCE);
    await page.getByTestId('message-assistant').nth(1).getByTestId('finish-badge').waitFor({ timeout: 120_000 });
    assert.equal(await lastReply(page).getByTestId('finish-badge').getAttribute('data-finish'), 'stop');
  });
});

test('Stop during a long reply cancels it on the server and shows cancelled', async () => {
  await withPage('badge-cancelled', {}, async (page) => {
    await newChat(page, { maxTokens: '400' });
    const body = await send(page, DRAGON);
    assert.equal(body.max_tokens, 400);
    // Let a few tokens arrive, then press the Stop button.
    await page.waitForFunction(() => {
      const r = [...document.querySelectorAll('[data-testid=message-assistant]')].pop();
      return Number(r?.querySelector('[data-testid=usage-completion]')?.getAttribute('data-value')) >= 5;
    });
    await screenshot(page, 'chat-live-usage');
    await page.getByTestId('stop-button').click();
    assert.equal(await waitFinish(page, 30_000), 'cancelled');
    await page.getByTestId('send-button').waitFor();
    const reply = lastReply(page);
    assert.ok((await reply.getByTestId('assistant-content').innerText()).length > 0, 'partial text kept');

    const id = await reply.getAttribute('data-response-id');
    const entry = await ledgerEntry(id);
    assert.deepEqual(entry.finish_reasons, ['cancelled']);
    assert.ok(entry.usage.completion_tokens < 400, `cancelled early: ${JSON.stringify(entry.usage)}`);
    // The figures shown are the ones the server recorded for the cancelled request.
    const shown = await shownStats(reply);
    assert.equal(shown.source, 'ledger');
    assert.equal(shown.completion, entry.usage.completion_tokens);
    assert.equal(shown.prompt, entry.usage.prompt_tokens);
    // Nothing is left running on the server.
    const nodes = (await api('/v1/cluster/nodes')).json.nodes;
    assert.equal(nodes.find((n) => n.self).requests.in_flight, 0);
  });
});

test('keyboard: Enter sends, Shift+Enter adds a line, Esc stops', async () => {
  await withPage('keyboard', {}, async (page) => {
    await newChat(page, { maxTokens: '400' });
    const input = page.getByTestId('composer-input');
    await input.click();
    await input.pressSequentially('first line');
    await input.press('Shift+Enter');
    await input.pressSequentially('second line');
    assert.equal(await input.inputValue(), 'first line\nsecond line');
    assert.equal(await page.getByTestId('message-user').count(), 0, 'Shift+Enter does not send');
    await input.fill(DRAGON);
    await input.press('Enter');
    await page.getByTestId('message-user').waitFor();
    assert.equal(await input.inputValue(), '', 'Enter sent and cleared the input');
    await page.waitForFunction(() => {
      const r = [...document.querySelectorAll('[data-testid=message-assistant]')].pop();
      return Number(r?.querySelector('[data-testid=usage-completion]')?.getAttribute('data-value')) >= 3;
    });
    await page.keyboard.press('Escape');
    assert.equal(await waitFinish(page, 30_000), 'cancelled');
  });
});

test('reasoning arrives in its own collapsible block with exact reasoning tokens', async () => {
  await withPage('reasoning', {}, async (page) => {
    await newChat(page, { reasoning: true, maxTokens: '24' });
    const body = await send(page, FRANCE);
    assert.equal(body.reasoning_effort, 'low');
    await waitFinish(page);
    const reply = lastReply(page);
    const block = reply.getByTestId('reasoning-block');
    await block.waitFor();
    assert.ok((await reply.getByTestId('reasoning-content').textContent()).trim().length > 0);
    const again = await streamChat(body);
    const shown = await shownStats(reply);
    assert.deepEqual(
      { prompt: shown.prompt, cached: shown.cached, completion: shown.completion, reasoning: shown.reasoning, total: shown.total },
      usageFigures(again.usage),
    );
    assert.ok(shown.reasoning > 0);
    // Collapsible: the summary toggles it.
    await block.locator('summary').click();
    const open1 = await block.evaluate((d) => d.open);
    await block.locator('summary').click();
    assert.notEqual(await block.evaluate((d) => d.open), open1);
  });
});

test('a server error is shown plainly, not as a blank page', async () => {
  await withPage('server-error', {}, async (page) => {
    await newChat(page, { maxTokens: '9000' });
    await send(page, FRANCE);
    assert.equal(await waitFinish(page), 'error');
    const msg = await lastReply(page).getByTestId('error-message').innerText();
    assert.match(msg, /400/);
    assert.match(msg, /context window is 8192/);
    await screenshot(page, 'server-error-shown');
    // The same message the API gives.
    const direct = await api('/v1/chat/completions', {
      model,
      messages: [{ role: 'user', content: FRANCE }],
      max_tokens: 9000,
      stream: true,
    });
    assert.equal(direct.status, 400);
    assert.ok(msg.includes(direct.json.error.message), `${msg} vs ${direct.json.error.message}`);
    // The page is still usable: fix the setting and retry.
    await page.getByTestId('setting-max-tokens').fill('');
    await lastReply(page).getByTestId('retry').click();
    assert.equal(await waitFinish(page), 'stop');
    assert.equal(await page.getByTestId('message-assistant').count(), 1);
  });
});

test('the cluster panel lists this node with live figures', async () => {
  await withPage('cluster', { path: '/cluster' }, async (page) => {
    let polls = 0;
    page.on('request', (r) => r.url().endsWith('/v1/cluster/nodes') && polls++);
    const card = page.locator('[data-testid=node-card][data-self=true]');
    await card.waitFor();
    const api1 = (await api('/v1/cluster/nodes')).json.nodes.find((n) => n.self);
    assert.equal(await card.getAttribute('data-node-id'), api1.id);
    assert.equal(await card.getByTestId('node-name').innerText(), api1.name);
    assert.equal(await card.getByTestId('node-address').innerText(), api1.address);
    assert.equal(await card.getByTestId('node-status').innerText(), 'online');
    assert.match(await card.getByTestId('node-models').innerText(), new RegExp(model.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')));
    const mem = card.getByTestId('node-memory');
    assert.equal(Number(await mem.getAttribute('data-total')), api1.memory.total_bytes);
    const used = Number(await mem.getAttribute('data-used'));
    assert.ok(used > 0 && used < api1.memory.total_bytes);
    assert.match(await mem.innerText(), /GiB|MiB/);
    assert.match(await card.getByTestId('node-requests').innerText(), /in flight/);
    // Polled every 2 s: a request in flight shows up while it runs, and goes
    // away when it ends (here: its client leaves).
    const client = new AbortController();
    const story = fetch(BASE + '/v1/chat/completions', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model, messages: [{ role: 'user', content: DRAGON }], max_tokens: 400, stream: true }),
      signal: client.signal,
    }).then((r) => r.text()).catch(() => null);
    const inFlight = (n) =>
      page.waitForFunction(
        (want) =>
          document.querySelector('[data-testid=node-card][data-self=true] [data-testid=node-requests]')?.getAttribute('data-in-flight') === want,
        String(n),
        { timeout: 15_000 },
      );
    await inFlight(1);
    await screenshot(page, 'cluster-busy');
    client.abort();
    await story;
    await inFlight(0);
    assert.ok(polls >= 2, `polled ${polls} times`);
  });
});

test('the usage view lists requests made outside the UI and refreshes by itself', async () => {
  await withPage('usage', { path: '/usage' }, async (page) => {
    await page.getByTestId('usage-table').waitFor();
    await page.getByTestId('usage-updated').filter({ hasText: 'updated' }).waitFor();
    // A request from another client (this test, not the page) after the view opened.
    const res = await api('/v1/chat/completions', {
      model,
      messages: [{ role: 'user', content: FRANCE }],
      temperature: 0,
      max_tokens: 5,
    });
    assert.equal(res.status, 200, res.text);
    const { id, usage } = res.json;
    const row = page.locator(`[data-testid=usage-row][data-id="${id}"]`);
    await row.waitFor({ timeout: 10_000 });
    assert.equal(await row.getByTestId('usage-row-prompt').innerText(), String(usage.prompt_tokens));
    assert.equal(await row.getByTestId('usage-row-completion').innerText(), String(usage.completion_tokens));
    assert.equal(await row.getByTestId('usage-row-total').innerText(), String(usage.total_tokens));
    assert.equal(await row.getByTestId('usage-row-finish').innerText(), 'length');
    assert.ok((await page.getByTestId('chart-bar').count()) >= 1, 'chart drawn');
    assert.ok((await page.locator('[data-testid=usage-chart] polyline').count()) === 1, 'tok/s line drawn');
  });
});

test('conversations and their settings persist across reloads and can be deleted', async () => {
  await withPage('persistence', {}, async (page) => {
    await newChat(page, { maxTokens: '3', system: 'You are terse.' });
    await send(page, 'Hello there');
    await waitFinish(page);
    await page.reload();
    const item = page.getByTestId('conversation-item').first();
    await item.waitFor();
    assert.equal(await item.innerText().then((t) => t.replace('×', '').trim()), 'Hello there');
    assert.equal(await page.getByTestId('message-user').count(), 1);
    assert.equal(await page.getByTestId('message-assistant').getByTestId('finish-badge').getAttribute('data-finish'), 'length');
    await page.getByTestId('settings-toggle').click();
    assert.equal(await page.getByTestId('setting-max-tokens').inputValue(), '3');
    assert.equal(await page.getByTestId('setting-system').inputValue(), 'You are terse.');
    const before = await page.getByTestId('conversation-item').count();
    await item.hover();
    await item.getByTestId('delete-conversation').click();
    assert.equal(await page.getByTestId('conversation-item').count(), before - 1);
  });
});

test('markdown renders code blocks and strips active content', async () => {
  const conv = {
    id: 'c_md',
    title: 'markdown',
    created: 1,
    updated: Date.now(),
    settings: { model: '', systemPrompt: '', temperature: 0, maxTokens: null, stop: [], reasoning: false },
    messages: [
      { id: 'm1', role: 'user', content: 'show code' },
      {
        id: 'm2',
        role: 'assistant',
        content:
          'Here is **bold** and `inline`.\n\n```python\nprint("<b>hi</b>")\n```\n\n<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>[link](javascript:window.__pwned=3)',
        finish: 'stop',
      },
    ],
  };
  await withPage('markdown', {}, async (page) => {
    await page.evaluate((c) => localStorage.setItem('shoal.conversations.v1', JSON.stringify([c])), conv);
    await page.reload();
    const md = lastReply(page).getByTestId('assistant-content');
    await md.waitFor();
    assert.equal(await md.locator('strong').innerText(), 'bold');
    assert.equal((await md.locator('pre code').innerText()).trim(), 'print("<b>hi</b>")');
    assert.equal(await md.locator('img, script').count(), 0);
    const hrefs = await md.locator('a').evaluateAll((as) => as.map((a) => a.getAttribute('href') ?? ''));
    assert.ok(hrefs.every((h) => !h.startsWith('javascript:')), JSON.stringify(hrefs));
    assert.equal(await page.evaluate(() => window.__pwned), undefined);
  });
});

test('narrow window, dark theme and the theme toggle', async () => {
  await withPage('narrow-dark', { width: 400, height: 800, colorScheme: 'dark' }, async (page) => {
    await newChat(page);
    await send(page, FRANCE);
    assert.equal(await waitFinish(page), 'stop');
    const fits = await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth);
    assert.ok(fits, 'no horizontal scrolling at 400px');
    const box = await page.getByTestId('composer-input').boundingBox();
    assert.ok(box && box.y + box.height <= 800 && box.x >= 0, 'composer on screen');
    const bg = () => page.evaluate(() => getComputedStyle(document.body).backgroundColor);
    const dark = await bg();
    // system (dark) → light → dark → system
    await page.getByTestId('theme-toggle').click();
    assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), 'light');
    const light = await bg();
    assert.notEqual(light, dark);
    await screenshot(page, 'narrow-light');
    await page.getByTestId('theme-toggle').click();
    assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), 'dark');
    assert.equal(await bg(), dark);
    await page.reload();
    assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), 'dark', 'choice kept');
    await page.getByTestId('theme-toggle').click();
    assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), undefined);
  });
});
