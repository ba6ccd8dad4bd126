// The web UI served by `shoal serve` at `/`, in Debian's chromium, against the
// real default model (greedy: temperature 0 in the chat settings).
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, test } from 'node:test';
import {
  api,
  BASE,
  currentServerId,
  launch,
  killServer,
  lastReply,
  ledgerEntry,
  newChat,
  openPage,
  usePage,
  screenshot,
  send,
  shownStats,
  startServer,
  storedConversation,
  streamChat,
  traceReplies,
  usageFigures,
  waitFinish,
} from './helpers.js';

// Greedy, the default model answers this in one sentence on both backends.
const FRANCE = 'What is the capital of France? Answer in one sentence.';
// A new chat is titled with its first message (up to 200 characters, cut to the
// sidebar's width on screen, whole in its tooltip).
const FRANCE_TITLE = FRANCE;
// The backend run-ui.sh serves on (SHOAL_BACKEND).
const BACKEND = process.env.SHOAL_BACKEND || 'mlx';
// A reply far longer than any test waits for: what a test stops is still running.
const COUNT = 'Write the numbers from 1 to 500 separated by commas.';

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
  await usePage(await openPage(browser, opts), name, body);
}

test('the binary serves the UI at / and unknown routes fall back to it', async () => {
  // A browser asks for HTML; anything else at / gets Ollama's liveness text.
  const root = await fetch(BASE + '/', { headers: { accept: 'text/html' } });
  assert.equal(root.status, 200);
  const html = await root.text();
  assert.match(html, /<div id="root">/, 'the binary was built without ui/dist');
  assert.equal(await (await fetch(BASE + '/')).text(), 'Ollama is running');
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
    assert.deepEqual(want, { prompt: 42, cached: 0, completion: 8, reasoning: 0, total: 50 });
    // And what the server's ledger recorded for the UI's own request.
    const id = await reply.getAttribute('data-response-id');
    assert.match(id, /^chatcmpl-/);
    const entry = await ledgerEntry(id);
    assert.deepEqual(usageFigures(entry.usage), want);
    assert.ok(shown.ttft > 0, 'TTFT shown');
    assert.ok(shown.tps > 0, 'tok/s shown');
    // The speed and TTFT shown once it ended are the server's, as the Usage view has them.
    // (Equal to the last bit or so: the reply's stored copy and the ledger's
    // row may differ in the last place of a double.)
    const close = (a, b) => Math.abs(a - b) <= 1e-9 * Math.abs(b);
    assert.ok(close(shown.ttft, entry.ttft_ms), `TTFT ${shown.ttft} vs ${entry.ttft_ms}`);
    assert.ok(close(shown.tps, entry.decode_tokens_per_s), `tok/s ${shown.tps} vs ${entry.decode_tokens_per_s}`);
    assert.match(await reply.getByTestId('finish-badge').getAttribute('title'), /ended the reply itself/);
  });
});

test('a reply\'s quiet stats line: tokens, speed and time in one row, every figure a click away', async () => {
  for (const width of [1280, 420]) {
    await withPage(`stats-line-${width}`, { width }, async (page) => {
      await newChat(page, { maxTokens: '8' });
      await send(page, FRANCE);
      await waitFinish(page);
      const reply = lastReply(page);
      const s = await shownStats(reply);
      const rate = s.tps >= 100 ? s.tps.toFixed(0) : s.tps.toFixed(1);
      const cached = s.cached ? ` · ${s.cached.toLocaleString('en-US')} cached` : '';
      const line = reply.getByTestId('usage-summary');
      assert.equal(await line.innerText(), `${s.completion} tok · ${rate} tok/s · ${(s.ttft / 1000).toFixed(2)} s${cached}`);
      // One row, all of it readable.
      assert.ok(await line.evaluate((el) => el.scrollWidth <= el.clientWidth), 'the line is cut');
      // The breakdown is one click away; a zero figure (no reasoning here) stays out of sight.
      const detail = reply.getByTestId('usage-detail');
      assert.equal(await detail.isVisible(), false);
      await line.click();
      assert.equal(await detail.isVisible(), true);
      assert.equal(await reply.getByTestId('usage-prompt').isVisible(), true);
      assert.equal(await reply.getByTestId('usage-total').isVisible(), true);
      assert.equal(await reply.getByTestId('usage-reasoning').isVisible(), false);
      await screenshot(page, `stats-line-${width}-open`);
      await line.click();
      assert.equal(await detail.isVisible(), false);
    });
  }
});

test('a new chat caps replies at 1024 tokens and shows the model\'s own sampling default', async () => {
  // A first-time user: the store has no chats yet (the suite's server has other tests' chats).
  const setup = (page) =>
    page.route('**/v1/conversations', (r) =>
      r.request().method() === 'GET' ? r.fulfill({ json: { object: 'list', data: [] } }) : r.continue(),
    );
  await withPage('defaults', { setup }, async (page) => {
    await page.getByTestId('model-picker').locator('option').first().waitFor({ state: 'attached' });
    await page.waitForFunction(() => document.querySelector('[data-testid=model-picker]')?.value);
    if (page.viewportSize().width <= 720) await page.getByTestId('sidebar-toggle').click();
    await page.getByTestId('new-chat').click();
    if ((await page.getByTestId('settings-panel').count()) === 0) await page.getByTestId('settings-toggle').click();
    // The cap is in the settings, where it can be changed.
    assert.equal(await page.getByTestId('setting-max-tokens').inputValue(), '1024');
    // Temperature left empty: the field names the model's default and where it came from.
    const listed = (await api('/v1/models')).json.data.find((m) => m.id === model);
    const want = listed.shoal.sampling_defaults.temperature;
    const temp = page.getByTestId('setting-temperature');
    assert.equal(await temp.inputValue(), '');
    assert.equal(Number(await temp.getAttribute('data-default')), want.value);
    assert.equal(await temp.getAttribute('data-default-source'), want.source);
    assert.equal(await temp.getAttribute('placeholder'), `model default ${want.value}`);
    // What is sent: the cap, and no temperature (the server applies the model's).
    await temp.fill('0');
    const body = await send(page, FRANCE);
    assert.equal(body.max_tokens, 1024);
    await waitFinish(page);
    await temp.fill('');
    await page.getByTestId('setting-max-tokens').fill('');
    const again = await send(page, COUNT);
    assert.equal(again.max_tokens, undefined, 'cleared: no cap sent');
    assert.equal(again.temperature, undefined, 'empty: the model default');
    // Uncapped, it could run to the context window: stop it, unless the
    // sampled reply has already ended (then the stop button is gone).
    await Promise.any([page.getByTestId('stop-button').click(), waitFinish(page)]);
    await waitFinish(page);
  });
});

test('max tokens shows the context window and refuses values outside it before sending', async () => {
  const ctx = (await api(`/v1/models/${encodeURIComponent(model)}`)).json.shoal.context_length;
  assert.equal(ctx, 8192);
  await withPage('max-tokens-checks', {}, async (page) => {
    await newChat(page, { maxTokens: String(ctx + 1) });
    assert.match(await page.getByTestId('context-window').innerText(), /of a 8,192-token window/);
    const error = page.getByTestId('setting-max-tokens-error');
    assert.match(await error.innerText(), /more than the model's 8,192-token window/);
    await page.getByTestId('composer-input').fill(FRANCE);
    assert.equal(await page.getByTestId('send-button').isDisabled(), true, 'not sent as it is');
    assert.match(await page.getByTestId('send-button').getAttribute('title'), /8,192-token window/);
    // Enter does not send it either.
    let sent = false;
    page.on('request', (r) => { if (r.url().endsWith('/v1/chat/completions')) sent = true; });
    await page.getByTestId('composer-input').press('Enter');
    await page.getByTestId('setting-max-tokens').fill('2.5');
    assert.match(await error.innerText(), /whole number/);
    await page.getByTestId('setting-max-tokens').fill('4');
    assert.equal(await error.count(), 0);
    assert.equal(sent, false, 'nothing was sent while the value was out of range');
    assert.equal(await page.getByTestId('send-button').isDisabled(), false);
    const body = await send(page, FRANCE);
    assert.equal(body.max_tokens, 4);
    assert.equal(await waitFinish(page), 'length');
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
    const badge = lastReply(page).getByTestId('finish-badge');
    assert.match(await badge.getAttribute('title'), /stop sequence/i);
    assert.equal(await badge.getAttribute('data-stop-sequence'), 'Paris');
    assert.equal(await badge.getByTestId('finish-stop-sequence').innerText(), '"Paris"');

    // Without the stop sequence the same chat ends naturally: plain "stop".
    await page.getByTestId('setting-stop').fill('');
    await send(page, FRANCE);
    await page.getByTestId('message-assistant').nth(1).getByTestId('finish-badge').waitFor({ timeout: 120_000 });
    assert.equal(await waitFinish(page), 'stop');

    // Both badges come back from the store after a reload.
    const id = await currentServerId(page);
    await page.reload();
    await page.locator(`[data-testid=conversation-item][data-server-id="${id}"]`).waitFor();
    const badges = page.getByTestId('message-assistant').getByTestId('finish-badge');
    await badges.nth(1).waitFor();
    assert.equal(await badges.nth(0).getAttribute('data-finish'), 'stop_sequence');
    assert.equal(await badges.nth(0).getAttribute('data-stop-sequence'), 'Paris');
    assert.equal(await badges.nth(1).getAttribute('data-finish'), 'stop');
    assert.equal(await badges.nth(1).getAttribute('data-stop-sequence'), null);
  });
});

test('Stop during a long reply cancels it on the server and shows cancelled', async () => {
  await withPage('badge-cancelled', {}, async (page) => {
    await newChat(page, { maxTokens: '4000' });
    const body = await send(page, COUNT);
    assert.equal(body.max_tokens, 4000);
    // Let a few tokens arrive, then press the Stop button.
    await page.waitForFunction(() => {
      const r = [...document.querySelectorAll('[data-testid=message-assistant]')].pop();
      return Number(r?.querySelector('[data-testid=usage-completion]')?.getAttribute('data-value')) >= 5;
    });
    await screenshot(page, 'chat-live-usage');
    // Figures not known yet read as one kind of dash.
    const liveText = await lastReply(page).getByTestId('reply-usage').innerText();
    assert.ok(!liveText.includes('–'), `an en dash among the em dashes: ${liveText}`);
    await page.getByTestId('stop-button').click();
    assert.equal(await waitFinish(page, 30_000), 'cancelled');
    await page.getByTestId('send-button').waitFor();
    const reply = lastReply(page);
    assert.ok((await reply.getByTestId('assistant-content').innerText()).length > 0, 'partial text kept');

    const id = await reply.getAttribute('data-response-id');
    const entry = await ledgerEntry(id);
    assert.deepEqual(entry.finish_reasons, ['cancelled']);
    assert.ok(entry.usage.completion_tokens < 4000, `cancelled early: ${JSON.stringify(entry.usage)}`);
    // The figures shown are the ones the server recorded for the cancelled request.
    const shown = await shownStats(reply);
    assert.equal(shown.source, 'ledger');
    assert.equal(await reply.getByTestId('usage-recorded').innerText(), 'as recorded');
    assert.equal(shown.completion, entry.usage.completion_tokens);
    assert.equal(shown.prompt, entry.usage.prompt_tokens);
    // Nothing is left running on the server.
    const nodes = (await api('/v1/cluster/nodes')).json.nodes;
    assert.equal(nodes.find((n) => n.self).requests.in_flight, 0);

    // After a reload: the same badge and figures, from the store.
    const text = await reply.getByTestId('assistant-content').innerText();
    await page.reload();
    const again = lastReply(page);
    await again.getByTestId('finish-badge').waitFor();
    assert.equal(await again.getAttribute('data-response-id'), id);
    assert.equal(await again.getByTestId('finish-badge').getAttribute('data-finish'), 'cancelled');
    assert.equal(await again.getByTestId('assistant-content').innerText(), text);
    const reloaded = await shownStats(again);
    assert.equal(reloaded.live, false);
    assert.equal(reloaded.source, 'ledger');
    assert.deepEqual(
      { prompt: reloaded.prompt, completion: reloaded.completion, total: reloaded.total },
      { prompt: shown.prompt, completion: shown.completion, total: shown.total },
    );
  });
});

test('keyboard: Enter sends, Shift+Enter adds a line, Esc stops', async () => {
  await withPage('keyboard', {}, async (page) => {
    await newChat(page, { maxTokens: '4000' });
    const input = page.getByTestId('composer-input');
    await input.click();
    await input.pressSequentially('first line');
    await input.press('Shift+Enter');
    await input.pressSequentially('second line');
    assert.equal(await input.inputValue(), 'first line\nsecond line');
    assert.equal(await page.getByTestId('message-user').count(), 0, 'Shift+Enter does not send');
    await input.fill(COUNT);
    await input.press('Enter');
    await page.getByTestId('message-user').waitFor();
    assert.equal(await input.inputValue(), '', 'Enter sent and cleared the input');
    await page.waitForFunction(() => {
      const r = [...document.querySelectorAll('[data-testid=message-assistant]')].pop();
      return Number(r?.querySelector('[data-testid=usage-completion]')?.getAttribute('data-value')) >= 3;
    });
    await page.keyboard.press('Escape');
    assert.equal(await waitFinish(page, 30_000), 'cancelled');
    // The message and the reply say when they were written, on hover.
    for (const m of [page.getByTestId('message-user').first(), lastReply(page)]) {
      const at = Number(await m.getAttribute('data-created'));
      assert.ok(at > Date.now() - 600_000 && at <= Date.now(), `written at ${at}`);
      assert.equal(await m.getAttribute('title'), await page.evaluate((t) => {
        const d = new Date(t);
        return `${d.toLocaleDateString([], { month: 'short', day: 'numeric' })}, ${d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' })}`;
      }, at));
    }
    // Shift+Esc goes to the message box from anywhere; Ctrl+Shift+O starts a new chat there.
    await page.getByTestId('settings-toggle').focus();
    await page.keyboard.press('Shift+Escape');
    assert.equal(await page.evaluate(() => document.activeElement?.dataset.testid), 'composer-input');
    const before = await page.locator('[data-testid=conversation-item].active').getAttribute('data-id');
    await page.keyboard.press('Control+Shift+O');
    await page.getByTestId('empty-chat').waitFor();
    assert.notEqual(await page.locator('[data-testid=conversation-item].active').getAttribute('data-id'), before);
    assert.equal(await page.evaluate(() => document.activeElement?.dataset.testid), 'composer-input');
  });
});

test('reasoning arrives in its own collapsible block with exact reasoning tokens', async () => {
  // A server of its own on a model that can reason: the default weights with a
  // `</think>` token (`make models`' fixture), for which the server opens the section.
  const { mkdtempSync } = await import('node:fs');
  const { join } = await import('node:path');
  const dir = mkdtempSync(join(process.env.SHOAL_UI_TMP || '/tmp', 'think-'));
  const think = process.env.SHOAL_TEST_THINK_GGUF
    || join(process.cwd(), '..', '..', '.cache/models/smollm2-think-v1/SmolLM2-135M-Instruct-think.Q4_1.gguf');
  const { url, proc } = await startServer(['--model', think, '--db', join(dir, 'store.sqlite')]);
  try {
    await withPage('reasoning', { base: url }, async (page) => {
      await newChat(page, { reasoning: true, maxTokens: '24' });
      assert.equal(await page.getByTestId('setting-reasoning').isDisabled(), false);
      const body = await send(page, FRANCE);
      assert.equal(body.reasoning_effort, 'low');
      await waitFinish(page);
      const reply = lastReply(page);
      const block = reply.getByTestId('reasoning-block');
      await block.waitFor();
      assert.ok((await reply.getByTestId('reasoning-content').textContent()).trim().length > 0);
      const again = await streamChat(body, url);
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
  } finally {
    await killServer(proc);
  }
});

test('a model that cannot reason: the control is off and says why, and the reply is all answer', async () => {
  const caps = (await api(`/v1/models/${encodeURIComponent(model)}`)).json.shoal.capabilities;
  assert.equal(caps.reasoning, false);
  await withPage('reasoning-unavailable', {}, async (page) => {
    await newChat(page, { maxTokens: '24' });
    const box = page.getByTestId('setting-reasoning');
    assert.equal(await box.isDisabled(), true);
    assert.equal(await box.isChecked(), false);
    assert.match(await page.getByTestId('reasoning-unavailable').innerText(), /cannot reason/);
    const body = await send(page, FRANCE);
    assert.equal(body.reasoning_effort, undefined, 'no reasoning asked of it');
    await waitFinish(page);
    const reply = lastReply(page);
    assert.equal(await reply.getByTestId('reasoning-block').count(), 0);
    const shown = await shownStats(reply);
    assert.equal(shown.reasoning, 0);
  });
  // Unloaded (as after its idle time), it still cannot reason, and the control still says so.
  const unloaded = await api(`/v1/models/${encodeURIComponent(model)}/unload`, {});
  assert.equal(unloaded.status, 200, unloaded.text);
  assert.equal((await api(`/v1/models/${encodeURIComponent(model)}`)).json.shoal.loaded, false);
  await withPage('reasoning-unavailable-unloaded', {}, async (page) => {
    await newChat(page, { maxTokens: '24' });
    assert.equal(await page.getByTestId('setting-reasoning').isDisabled(), true);
    assert.match(await page.getByTestId('reasoning-unavailable').innerText(), /cannot reason/);
  });
});

test('a server error is shown plainly, not as a blank page', async () => {
  await withPage('server-error', {}, async (page) => {
    // A temperature the server refuses: the form refuses it too, so the
    // request is changed on its way (once) and the server's real 400 comes back.
    await newChat(page);
    await page.route(
      '**/v1/chat/completions',
      (route) => route.continue({ postData: JSON.stringify({ ...JSON.parse(route.request().postData()), temperature: 3 }) }),
      { times: 1 },
    );
    await send(page, FRANCE);
    assert.equal(await waitFinish(page), 'error');
    const msg = await lastReply(page).getByTestId('error-message').innerText();
    assert.match(msg, /400/);
    assert.match(msg, /temperature/);
    await screenshot(page, 'server-error-shown');
    // The same message the API gives.
    const direct = await api('/v1/chat/completions', {
      model,
      messages: [{ role: 'user', content: FRANCE }],
      temperature: 3,
      stream: true,
    });
    assert.equal(direct.status, 400);
    assert.ok(msg.includes(direct.json.error.message), `${msg} vs ${direct.json.error.message}`);
    // The page is still usable: retry.
    await lastReply(page).getByTestId('retry').click();
    assert.equal(await waitFinish(page), 'stop');
    assert.equal(await page.getByTestId('message-assistant').count(), 1);
    // The store dropped the failed exchange too: one question, one answer.
    const stored = await storedConversation(await currentServerId(page));
    assert.deepEqual(
      stored.messages.map((m) => [m.role, m.pieces[0].kind]),
      [['user', 'text'], ['assistant', 'text']],
    );
    assert.equal(stored.messages[1].pieces[0].metadata.finish_reason, 'stop');
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
    // Each model names the engine it runs on, as /v1/cluster/nodes says.
    const held = api1.models.find((m) => m.id === model);
    assert.ok(['mlx', 'llama'].includes(held.backend), JSON.stringify(api1.models));
    const item = card.getByTestId('node-model').filter({ hasText: model });
    assert.equal(await item.getAttribute('data-backend'), held.backend);
    assert.match(await item.innerText(), held.backend === 'mlx' ? /\bMLX\b/ : /llama\.cpp/);
    const mem = card.getByTestId('node-memory');
    assert.equal(Number(await mem.getAttribute('data-total')), api1.memory.total_bytes);
    const used = Number(await mem.getAttribute('data-used'));
    assert.ok(used > 0 && used < api1.memory.total_bytes);
    assert.match(await mem.innerText(), /GiB|MiB/);
    assert.match(await card.getByTestId('node-requests').innerText(), /in flight/);
    // Polled every 2 s: a request in flight shows up while it runs, and goes
    // away when it ends (here: its client leaves). The request runs until the
    // test ends it, so the poll cannot miss it.
    const client = new AbortController();
    const story = fetch(BASE + '/v1/chat/completions', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model, messages: [{ role: 'user', content: COUNT }], max_tokens: 4000, temperature: 0, stream: true }),
      signal: client.signal,
    }).then((r) => r.text()).catch(() => null);
    const inFlight = (n) =>
      page.waitForFunction(
        (want) =>
          document.querySelector('[data-testid=node-card][data-self=true] [data-testid=node-requests]')?.getAttribute('data-in-flight') === want,
        String(n),
        { timeout: 120_000 }, // a hang guard: the wait ends on the state
      );
    await inFlight(1);
    await screenshot(page, 'cluster-busy');
    client.abort();
    await story;
    await inFlight(0);
    assert.ok(polls >= 2, `polled ${polls} times`);
  });
  // In a narrow window the node's card fits the width: its figures in view, nothing scrolls sideways.
  await withPage('cluster-420', { path: '/cluster', width: 420 }, async (page) => {
    const card = page.locator('[data-testid=node-card][data-self=true]');
    await card.getByTestId('node-memory').waitFor();
    const box = await card.boundingBox();
    assert.ok(box.x >= 0 && box.x + box.width <= 420, JSON.stringify(box));
    assert.equal(await page.evaluate(() => document.documentElement.scrollWidth), 420);
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
    // The chart is the API's sums per bucket (all time on a fresh server: per hour).
    const unit = await page.getByTestId('usage-chart').getAttribute('data-unit');
    const bars = await chartMatches(page, '', unit);
    assert.ok(bars.length > 0);
  });
});

test('the usage dashboard: its filters, sums and export match /v1/usage', async () => {
  // One request in each of two dialects, so a dialect filter has something to leave out.
  const chat = await api('/v1/chat/completions', { model, messages: [{ role: 'user', content: FRANCE }], temperature: 0, max_tokens: 4 });
  assert.equal(chat.status, 200, chat.text);
  const msg = await api('/v1/messages', { model, messages: [{ role: 'user', content: FRANCE }], temperature: 0, max_tokens: 3 });
  assert.equal(msg.status, 200, msg.text);
  await withPage('usage-dashboard', { path: '/usage' }, async (page) => {
    await page.getByTestId('usage-updated').filter({ hasText: 'updated' }).waitFor();
    await page.getByTestId('usage-filter-dialect').selectOption('anthropic.messages');
    const q = 'dialect=anthropic.messages';
    // Every row shown is a Messages request, and the newest is ours.
    await page.locator(`[data-testid=usage-row][data-id="${msg.json.id}"]`).waitFor();
    const want = (await api(`/v1/usage?${q}&limit=100`)).json.data.map((e) => e.id);
    await page.waitForFunction((n) => document.querySelectorAll('[data-testid=usage-row]').length === n, want.length);
    const shown = await page.getByTestId('usage-row').evaluateAll((rows) => rows.map((r) => r.dataset.id));
    assert.deepEqual(shown, want);
    assert.ok(!shown.includes(chat.json.id), 'the chat request is filtered out');
    // The cards and the per-model sums are the API's sums for the filter.
    const byModel = (await api(`/v1/usage?${q}&group_by=model`)).json.data;
    const total = byModel.reduce((a, g) => a + g.requests, 0);
    await page.waitForFunction((n) => document.querySelector('[data-testid=usage-count]')?.textContent === String(n), total);
    const prompt = byModel.reduce((a, g) => a + g.prompt_tokens, 0);
    const cached = byModel.reduce((a, g) => a + g.cached_tokens, 0);
    assert.equal(await page.getByTestId('usage-total-prompt').innerText(), prompt.toLocaleString('en-US'));
    assert.equal(await page.getByTestId('usage-cache-hit').innerText(), prompt ? `${((cached * 100) / prompt).toFixed(1)}%` : '–');
    const row = page.locator(`[data-testid=usage-by-model] [data-testid=group-row][data-key="${model}"]`);
    const g = byModel.find((x) => x.key === model);
    assert.equal(await row.getByTestId('group-requests').innerText(), String(g.requests));
    assert.equal(await row.getByTestId('group-total').innerText(), g.total_tokens.toLocaleString('en-US'));
    // This server has no prices: nothing speaks of cost.
    assert.equal(await page.getByTestId('usage-cost-card').count(), 0);
    assert.equal(await page.getByTestId('group-cost').count(), 0);
    // The export is the server's CSV for the same filter.
    const download = page.waitForEvent('download');
    await page.getByTestId('usage-export').click();
    const file = await (await download).path();
    const { readFileSync } = await import('node:fs');
    const exported = readFileSync(file, 'utf8');
    assert.equal(exported, (await api(`/v1/usage?${q}&format=csv`)).text);
    assert.equal(exported.trim().split('\n').length, want.length + 1, exported);
  });
});

test('a filter change shows its own rows at once, and a load started before it never overwrites them', async () => {
  const msg = await api('/v1/messages', { model, messages: [{ role: 'user', content: FRANCE }], temperature: 0, max_tokens: 2 });
  assert.equal(msg.status, 200, msg.text);
  // Loads without a dialect filter are held until released, as a slow poll would be
  // (the key sums, which no filter narrows, pass).
  const held = [];
  let hold = false;
  let firstHeld;
  const someHeld = new Promise((r) => (firstHeld = r));
  const setup = (page) =>
    page.route('**/v1/usage**', (r) => {
      const url = r.request().url();
      if (hold && !url.includes('dialect=') && !url.includes('/v1/usage/keys')) {
        held.push(r);
        firstHeld();
      } else void r.continue();
    });
  await withPage('usage-filter-fresh', { path: '/usage', setup }, async (page) => {
    await page.getByTestId('usage-updated').filter({ hasText: 'updated' }).waitFor();
    hold = true;
    await page.getByTestId('usage-refresh').click();
    // The event itself: the refresh's first request to the ledger is held.
    await someHeld;
    await page.getByTestId('usage-filter-dialect').selectOption('anthropic.messages');
    const want = (await api('/v1/usage?dialect=anthropic.messages&limit=100')).json.data.map((e) => e.id);
    // The filtered rows come while the older load is still held.
    await page.waitForFunction((n) => document.querySelectorAll('[data-testid=usage-row]').length === n, want.length);
    const shown = () => page.getByTestId('usage-row').evaluateAll((rows) => rows.map((r) => r.dataset.id));
    assert.deepEqual(await shown(), want);
    // Released, the older load's answers arrive and are dropped.
    hold = false;
    const answered = held.map((r) => page.waitForResponse((res) => res.request() === r.request()));
    for (const r of held) await r.continue();
    await Promise.all(answered);
    await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => r())));
    assert.deepEqual(await shown(), want);
  });
});

test('the usage view\'s bars per hour, day or week, and a table per dialect, finish, node, model or client', async () => {
  const r = await api('/v1/chat/completions', { model, messages: [{ role: 'user', content: FRANCE }], temperature: 0, max_tokens: 2 });
  assert.equal(r.status, 200, r.text);
  await withPage('usage-buckets-groups', { path: '/usage' }, async (page) => {
    await page.getByTestId('usage-updated').filter({ hasText: 'updated' }).waitFor();
    // Per week: the bars are the server's weeks, each keyed by its Monday.
    await page.getByTestId('usage-bucket').selectOption('week');
    await page.locator('[data-testid=usage-chart][data-unit=week]').waitFor();
    const weeks = (await api('/v1/usage?group_by=week')).json.data;
    assert.ok(weeks.length >= 1);
    for (const w of weeks) {
      assert.equal(new Date(`${w.key}T00:00:00Z`).getUTCDay(), 1, `${w.key} is a Monday`);
      const bar = page.locator(`[data-testid=chart-bar][data-key="${w.key}"]`);
      assert.equal(Number(await bar.getAttribute('data-total')), w.total_tokens);
    }
    await page.getByTestId('usage-bucket').selectOption('hour');
    await page.locator('[data-testid=usage-chart][data-unit=hour]').waitFor();
    // A table by the group chosen: its rows are the server's sums for it.
    for (const by of ['finish', 'dialect']) {
      await page.getByTestId('usage-group-by').selectOption(by);
      const want = (await api(`/v1/usage?group_by=${by}`)).json.data;
      const table = page.getByTestId('usage-by-chosen');
      await page.waitForFunction(
        ([keys]) => {
          const shown = [...document.querySelectorAll('[data-testid=usage-by-chosen] [data-testid=group-row]')].map((r) => r.dataset.key);
          return shown.length === keys.length && keys.every((k) => shown.includes(k));
        },
        [want.map((g) => g.key)],
      );
      for (const g of want) {
        const row = table.locator(`[data-testid=group-row][data-key="${g.key}"]`);
        assert.equal(await row.getByTestId('group-requests').innerText(), g.requests.toLocaleString('en-US'), `${by} ${g.key}`);
      }
    }
  });
});

test('an Ollama request is in the usage dashboard under its own dialect, with its counts', async () => {
  const r = await api('/api/chat', { model, messages: [{ role: 'user', content: FRANCE }], stream: false, options: { temperature: 0, num_predict: 4 } });
  assert.equal(r.status, 200, r.text);
  const entry = (await api('/v1/usage?dialect=ollama&limit=1')).json.data[0];
  assert.equal(entry.usage.prompt_eval_count, r.json.prompt_eval_count);
  await withPage('usage-ollama', { path: '/usage' }, async (page) => {
    await page.getByTestId('usage-updated').filter({ hasText: 'updated' }).waitFor();
    // The dialect list comes from the server, Ollama's included.
    await page.getByTestId('usage-filter-dialect').selectOption('ollama');
    const row = page.locator(`[data-testid=usage-row][data-id="${entry.id}"]`);
    await row.waitFor();
    assert.equal(await row.getByTestId('usage-row-prompt').innerText(), String(r.json.prompt_eval_count));
    assert.equal(await row.getByTestId('usage-row-completion').innerText(), String(r.json.eval_count));
    assert.equal(await row.getByTestId('usage-row-finish').innerText(), r.json.done_reason);
  });
});

/** Enough requests for a full log (the suite's earlier ones count), and one refused before a model was chosen. */
async function usageTraffic() {
  const have = (await api('/v1/usage?limit=200')).json.data.length;
  for (let i = have; i < 14; i++) {
    const r = await api('/v1/chat/completions', { model, messages: [{ role: 'user', content: FRANCE }], temperature: 0, max_tokens: 1 });
    assert.equal(r.status, 200, r.text);
  }
  if (!(await api('/v1/usage?group_by=model')).json.data.some((g) => g.key === '')) {
    const r = await api('/v1/chat/completions', { model: 'no-such-model', messages: [{ role: 'user', content: FRANCE }] });
    assert.ok(r.status >= 400, r.text);
    assert.ok((await api('/v1/usage?group_by=model')).json.data.some((g) => g.key === ''), 'the refusal is in the ledger without a model');
  }
}

/** The chart's unit and bars (key, total). */
const chartBars = (page) =>
  page.evaluate(() => ({
    unit: document.querySelector('[data-testid=usage-chart]')?.dataset.unit,
    bars: [...document.querySelectorAll('[data-testid=chart-bar]')].map((g) => ({ key: g.dataset.key, total: Number(g.dataset.total) })),
  }));

/**
 * Waits for the chart to show the API's `group_by=unit` sums for `query`
 * (the page redraws it on its next refresh): each of its buckets drawn, every
 * other bar empty, and with `n` given, `n` bars (so a chart of the filter
 * before is not taken for this one). Resolves with the bars.
 */
async function chartMatches(page, query, unit, n) {
  const want = (await api(`/v1/usage?${query}&group_by=${unit}`)).json.data.map((g) => [g.key, g.total_tokens]);
  const drawn = await page
    .waitForFunction(
      ({ want, unit, n }) => {
        const chart = document.querySelector('[data-testid=usage-chart]');
        if (chart?.dataset.unit !== unit) return false;
        const bars = [...chart.querySelectorAll('[data-testid=chart-bar]')].map((g) => [g.dataset.key, Number(g.dataset.total)]);
        const sums = new Map(want);
        const keys = new Set(bars.map(([k]) => k));
        const same = bars.every(([k, t]) => t === (sums.get(k) ?? 0)) && want.every(([k]) => keys.has(k));
        return same && (n === undefined || bars.length === n);
      },
      { want, unit, n },
      { timeout: 30_000 },
    )
    .then(() => true, () => false);
  const shown = await chartBars(page);
  assert.ok(drawn, `the chart ${JSON.stringify(shown)} is not ${n ?? 'the'} bars of /v1/usage?${query} per ${unit}: ${JSON.stringify(want)}`);
  return shown.bars;
}

/** A bucket key's start in Unix seconds. */
const bucketStart = (key) => Date.parse(key.length > 10 ? `${key}:00:00Z` : `${key}T00:00:00Z`) / 1000;

/** Asserts the bars are consecutive buckets `step` seconds apart, reaching at least to the newest request. */
async function assertRange(bars, step) {
  bars.forEach((b, i) => i && assert.equal(bucketStart(b.key) - bucketStart(bars[i - 1].key), step, `${bars[i - 1].key} → ${b.key}`));
  const newest = (await api('/v1/usage?limit=1')).json.data[0].created;
  const last = bars[bars.length - 1].key;
  assert.ok(newest < bucketStart(last) + step, `the last bucket ${last} is before the newest request (${newest})`);
}

/** How many request-log rows are wholly in sight: inside the window and the log's own box, below its header. */
const rowsInSight = (log) =>
  log.evaluate((box) => {
    const b = box.getBoundingClientRect();
    const top = Math.max(b.top, box.querySelector('thead').getBoundingClientRect().bottom, 0);
    const bottom = Math.min(b.bottom, window.innerHeight);
    return [...box.querySelectorAll('[data-testid=usage-row]')].filter((r) => {
      const x = r.getBoundingClientRect();
      return x.top >= top - 1 && x.bottom <= bottom + 1;
    }).length;
  });

test('the usage view: a full request log, charts bucketed by the range, worded gaps and empty states', async () => {
  await usageTraffic();
  const requests = (await api('/v1/usage?limit=200')).json.data.length;
  await withPage('usage-empty-filter', { path: '/usage' }, async (page) => {
    await page.getByTestId('usage-updated').filter({ hasText: 'updated' }).waitFor();
    assert.equal(
      await page.getByTestId('usage-subtitle').innerText(),
      'Every request this server answered, from any client, kept in its ledger.',
    );
    await page.waitForFunction((n) => document.querySelectorAll('[data-testid=usage-row]').length >= n, Math.min(requests, 100));
    await screenshot(page, 'usage-1280-top');
    // Each row names its model and its day; its long id is the row's hover, not a column.
    const newest = (await api('/v1/usage?limit=1')).json.data[0];
    const row = page.locator(`[data-testid=usage-row][data-id="${newest.id}"]`);
    assert.equal(await row.getByTestId('usage-row-model').innerText(), newest.model || 'no model');
    assert.ok((await row.getAttribute('title')).startsWith(newest.id), await row.getAttribute('title'));
    const day = await page.evaluate((t) => new Date(t * 1000).toLocaleDateString([], { month: 'short', day: 'numeric' }), newest.created);
    assert.ok((await row.getByTestId('usage-row-time').innerText()).startsWith(day), `a date: ${day}`);
    assert.equal(await page.locator('[data-testid=usage-table] thead th', { hasText: /^id$/ }).count(), 0);

    // The log, scrolled to, shows a window's worth of rows (not two in a squeezed box).
    const log = page.getByTestId('usage-log');
    await log.scrollIntoViewIfNeeded();
    const seen = await rowsInSight(log);
    assert.ok(seen >= 8, `${seen} rows in sight at 1280×800`);
    await screenshot(page, 'usage-1280-log');
    // In a short window its rows scroll in its box, under a header that stays put.
    await page.setViewportSize({ width: 1280, height: 480 });
    await log.scrollIntoViewIfNeeded();
    const sticky = await log.evaluate((box) => {
      box.scrollTop = box.scrollHeight;
      return { scrolled: box.scrollTop, head: box.querySelector('thead th').getBoundingClientRect().top - box.getBoundingClientRect().top };
    });
    assert.ok(sticky.scrolled > 0, 'the log scrolls in its box');
    assert.ok(Math.abs(sticky.head) <= 2, `the header is ${sticky.head}px from the log's top`);
    await page.setViewportSize({ width: 1280, height: 800 });

    // Per model fits whole, its total row in sight and equal to the cards.
    const byModel = page.getByTestId('usage-by-model');
    await byModel.locator('[data-testid=group-total-row]').scrollIntoViewIfNeeded();
    const fit = await byModel.evaluate((t) => {
      const wrap = t.parentElement.getBoundingClientRect();
      const cell = t.querySelector('tfoot [data-testid=group-total]').getBoundingClientRect();
      return { over: t.parentElement.scrollWidth - t.parentElement.clientWidth, inside: cell.left >= wrap.left && cell.right <= wrap.right && cell.bottom <= window.innerHeight };
    });
    assert.deepEqual(fit, { over: 0, inside: true });
    const models = (await api('/v1/usage?group_by=model')).json.data;
    const sum = (k) => models.reduce((a, g) => a + g[k], 0).toLocaleString('en-US');
    await page.waitForFunction(
      (n) => document.querySelector('[data-testid=usage-by-model] tfoot [data-testid=group-requests]')?.textContent === n,
      sum('requests'),
    );
    assert.equal(await byModel.locator('tfoot [data-testid=group-total]').innerText(), sum('total_tokens'));
    assert.equal(await page.getByTestId('usage-count').innerText(), sum('requests'));

    // Rows without a key or a model say so in words, never a bare dash.
    assert.equal(await byModel.locator('[data-testid=group-row][data-key=""] td').first().innerText(), 'refused before a model was chosen');
    assert.equal(
      await page.locator('[data-testid=usage-by-client] [data-testid=group-row][data-key=""] td').first().innerText(),
      'no API key',
    );
    const clients = await page.getByTestId('usage-row-client').allInnerTexts();
    assert.deepEqual([...new Set(clients)], ['no API key']);
    const dashes = await page.getByTestId('usage-view').locator('td').evaluateAll((tds) => tds.filter((td) => td.textContent.trim() === '–').length);
    assert.equal(dashes, 0);

    // The chart buckets by the range: hours up to two days, then days, empty buckets drawn.
    await page.getByTestId('usage-filter-since').selectOption('1h');
    // The last hour spans two clock hours, the last 24 hours 25, the last 7 days 8 days.
    await assertRange(await chartMatches(page, 'since=1h', 'hour', 2), 3600);
    await page.getByTestId('usage-filter-since').selectOption('24h');
    await assertRange(await chartMatches(page, 'since=24h', 'hour', 25), 3600);
    await page.getByTestId('usage-filter-since').selectOption('7d');
    const week = await chartMatches(page, 'since=7d', 'day', 8);
    await assertRange(week, 86_400);
    assert.ok(week.filter((b) => b.total === 0).length >= 6, `empty days drawn: ${JSON.stringify(week)}`);

    // A filter nothing matches: each part says what would be there.
    assert.equal((await api('/v1/usage?since=7d&finish=content_filter&limit=1')).json.data.length, 0);
    await page.getByTestId('usage-filter-finish').selectOption('content_filter');
    const chartEmpty = page.getByTestId('usage-chart-empty');
    await chartEmpty.waitFor();
    assert.equal(await page.getByTestId('usage-chart').count(), 0, 'no chart with an empty axis');
    assert.match(await chartEmpty.innerText(), /^No requests match these filters — each day's prompt, cached and completion tokens are charted here\.$/);
    assert.deepEqual(await page.getByTestId('group-empty').allInnerTexts(), [
      "No requests match these filters — each model's requests and tokens appear here.",
      "No requests match these filters — each API key's requests and tokens appear here.",
      "No requests match these filters — each dialect's requests and tokens appear here.",
    ]);
    assert.equal(await page.getByTestId('usage-empty').innerText(), 'No requests match these filters — requests to any API appear here with their tokens.');
    assert.equal(await page.getByTestId('usage-row').count(), 0);
  });
});

test('the usage view in a narrow window: the request log is reachable, one card per request', async () => {
  await usageTraffic();
  await withPage('usage-420-log', { path: '/usage', width: 420, height: 800 }, async (page) => {
    await page.getByTestId('usage-row').nth(7).waitFor({ state: 'attached' });
    await screenshot(page, 'usage-420-top');
    const log = page.getByTestId('usage-log');
    await log.scrollIntoViewIfNeeded();
    // Cards are taller than rows: a window shows fewer, never a squeezed two.
    const seen = await rowsInSight(log);
    assert.ok(seen >= 6, `${seen} rows in sight at 420×800`);
    // One card per request, every figure labelled in sight: nothing scrolls sideways.
    const cards = await log.evaluate((box) => {
      const row = box.querySelector('[data-testid=usage-row]');
      const prompt = row.querySelector('[data-testid=usage-row-prompt]');
      const rowBox = row.getBoundingClientRect();
      const cells = [...row.querySelectorAll('td')].map((td) => td.getBoundingClientRect());
      return {
        over: box.scrollWidth - box.clientWidth,
        page: document.documentElement.scrollWidth - window.innerWidth,
        head: getComputedStyle(box.querySelector('thead')).display,
        label: getComputedStyle(prompt, '::before').content,
        inside: cells.every((c) => c.left >= rowBox.left - 1 && c.right <= rowBox.right + 1),
      };
    });
    assert.deepEqual(cards, { over: 0, page: 0, head: 'none', label: '"prompt "', inside: true });
  });
});

test('the settings switch serves Ollama\'s port, and says plainly when the port is taken', async () => {
  // Hold Ollama's port ourselves (or find it held already): either way it is taken.
  const holder = net.createServer();
  const held = await new Promise((resolve) => {
    holder.once('error', () => resolve(false));
    holder.listen(11434, '127.0.0.1', () => resolve(true));
  });
  try {
    await withPage('ollama-switch', {}, async (page) => {
      // The server's settings are a page of their own, linked from a chat's settings.
      await newChat(page);
      await page.getByTestId('server-settings-link').getByRole('link').click();
      await page.getByTestId('server-view').waitFor();
      assert.equal(new URL(page.url()).pathname, '/server');
      assert.equal(await page.getByTestId('settings-panel').count(), 0);
      const box = page.getByTestId('setting-ollama-port');
      const status = page.getByTestId('ollama-port-status');
      await status.waitFor();
      assert.equal(await box.isChecked(), false, 'off unless switched on');
      assert.match(await status.innerText(), /^Off/);

      await box.check();
      await page.waitForFunction(() => document.querySelector('[data-testid=ollama-port-status]')?.textContent?.includes('taken'));
      assert.match(await status.innerText(), /port 11434 is taken/);
      assert.equal(await status.getAttribute('role'), 'alert');
      const setting = await api('/v1/settings/ollama-port');
      assert.deepEqual([setting.json.enabled, setting.json.listening], [true, false]);
      // The chat's own port serves Ollama's API regardless.
      assert.equal((await api('/api/tags')).status, 200);

      if (held) {
        // Freed, switched off and on again: Shoal answers on 11434.
        await new Promise((resolve) => holder.close(resolve));
        await box.uncheck();
        await page.waitForFunction(() => document.querySelector('[data-testid=ollama-port-status]')?.textContent?.startsWith('Off'));
        await box.check();
        await page.waitForFunction(() => document.querySelector('[data-testid=ollama-port-status]')?.dataset.listening === 'true');
        assert.match(await status.innerText(), /find Shoal there/);
        const tags = await fetch('http://127.0.0.1:11434/api/tags');
        assert.equal(tags.status, 200);
        assert.ok((await tags.json()).models.some((m) => m.name === `${model}:latest`));
      }
      await box.uncheck();
      await page.waitForFunction(() => document.querySelector('[data-testid=ollama-port-status]')?.textContent?.startsWith('Off'));
      assert.equal((await api('/v1/settings/ollama-port')).json.enabled, false);
    });
  } finally {
    if (holder.listening) holder.close();
  }
});

test('with prices set the usage dashboard shows what the traffic would have cost', async () => {
  const { mkdtempSync, writeFileSync } = await import('node:fs');
  const { join } = await import('node:path');
  const dir = mkdtempSync(join(process.env.SHOAL_UI_TMP || '/tmp', 'prices-'));
  const config = join(dir, 'config.toml');
  writeFileSync(config, `[prices.${JSON.stringify(model)}]\ninput_per_mtok = 2.0\ncached_input_per_mtok = 0.5\noutput_per_mtok = 10.0\n`);
  const { url, proc } = await startServer(['--config', config, '--db', join(dir, 'store.sqlite')]);
  try {
    const r = await api('/v1/chat/completions', { model, messages: [{ role: 'user', content: FRANCE }], temperature: 0, max_tokens: 4 }, 'POST', { base: url });
    assert.equal(r.status, 200, r.text);
    // The cost of what the client was sent: cached prompt tokens at the cached price.
    const u = r.json.usage;
    const cached = u.prompt_tokens_details?.cached_tokens ?? 0;
    const want = ((u.prompt_tokens - cached) * 2 + cached * 0.5 + u.completion_tokens * 10) / 1e6;
    const sums = (await api('/v1/usage?group_by=day', undefined, 'GET', { base: url })).json;
    assert.ok(Math.abs(sums.cost.total - want) < 1e-12, JSON.stringify(sums));
    assert.deepEqual(sums.unpriced_models, []);
    await withPage('usage-cost', { path: '/usage', base: url }, async (page) => {
      const card = page.getByTestId('usage-cost');
      await card.waitFor();
      assert.equal(Number(await card.getAttribute('data-value')), sums.cost.total);
      assert.equal(await page.getByTestId('usage-unpriced').innerText(), 'every model priced');
      const byModel = page.locator(`[data-testid=usage-by-model] [data-testid=group-row][data-key="${model}"] [data-testid=group-cost]`);
      assert.equal(Number(await byModel.getAttribute('data-value')), sums.cost.total);
      const entry = page.locator(`[data-testid=usage-row][data-id="${r.json.id}"] [data-testid=usage-row-cost]`);
      await entry.waitFor();
      assert.ok(Math.abs(Number(await entry.getAttribute('data-value')) - want) < 1e-12);
    });
  } finally {
    await killServer(proc);
  }
});

test('a server killed and restarted keeps its usage history in the dashboard', async () => {
  const { mkdtempSync } = await import('node:fs');
  const { join } = await import('node:path');
  const dir = mkdtempSync(join(process.env.SHOAL_UI_TMP || '/tmp', 'restart-'));
  const args = ['--db', join(dir, 'store.sqlite')];
  let { url, proc } = await startServer(args);
  let ids = [];
  try {
    for (const max_tokens of [2, 3]) {
      const r = await api('/v1/chat/completions', { model, messages: [{ role: 'user', content: FRANCE }], temperature: 0, max_tokens }, 'POST', { base: url });
      assert.equal(r.status, 200, r.text);
      ids.push(r.json.id);
    }
  } finally {
    await killServer(proc);
  }
  ({ url, proc } = await startServer(args));
  try {
    await withPage('usage-after-restart', { path: '/usage', base: url }, async (page) => {
      for (const id of ids) await page.locator(`[data-testid=usage-row][data-id="${id}"]`).waitFor();
      assert.equal(await page.getByTestId('usage-count').innerText(), '2');
    });
  } finally {
    await killServer(proc);
  }
});

test('the whole-cluster scope and the cluster view show a second node\'s requests', async () => {
  const { mkdtempSync } = await import('node:fs');
  const { join } = await import('node:path');
  const dir = mkdtempSync(join(process.env.SHOAL_UI_TMP || '/tmp', 'cluster-'));
  const common = ['--cluster-secret', 'ui-cluster', '--no-mdns'];
  const a = await startServer([...common, '--db', join(dir, 'a.sqlite')]);
  let b;
  try {
    b = await startServer([...common, '--db', join(dir, 'b.sqlite'), '--peer', a.url.replace('http://', '')]);
    const bId = (await api('/v1/cluster/nodes', undefined, 'GET', { base: b.url })).json.nodes.find((n) => n.self).id;
    // A request B received and ran: only B's ledger has it.
    const r = await api('/v1/chat/completions', { model, messages: [{ role: 'user', content: FRANCE }], temperature: 0, max_tokens: 3 }, 'POST', { base: b.url });
    assert.equal(r.status, 200, r.text);
    await withPage('usage-cluster-scope', { path: '/cluster', base: a.url }, async (page) => {
      // A lists B online: the cluster view shows it (the timeout only guards against a hang).
      await page
        .locator(`[data-testid=node-card][data-node-id="${bId}"] [data-testid=node-status]`)
        .filter({ hasText: 'online' })
        .waitFor({ timeout: 120_000 });
      await page.getByTestId('nav-usage').click();
      await page.getByTestId('usage-updated').filter({ hasText: 'updated' }).waitFor();
      assert.equal(await page.locator(`[data-testid=usage-row][data-id="${r.json.id}"]`).count(), 0, 'not this server\'s');
      assert.match(await page.getByTestId('usage-subtitle').innerText(), /^Every request this server answered/);
      await page.getByTestId('usage-filter-scope').selectOption('cluster');
      // The subtitle speaks of the scope chosen.
      assert.match(await page.getByTestId('usage-subtitle').innerText(), /^Every request the cluster's nodes answered, .* merged from each online node's ledger\.$/);
      await page.locator(`[data-testid=usage-row][data-id="${r.json.id}"]`).waitFor();
      assert.equal(await page.getByTestId('usage-count').innerText(), '1');
      // The cluster view: B served this request's tokens, A none.
      await page.getByTestId('nav-cluster').click();
      const served = page.locator(`[data-testid=node-card][data-node-id="${bId}"] [data-testid=node-served]`);
      await page.waitForFunction(
        ([id, total]) => document.querySelector(`[data-testid=node-card][data-node-id="${id}"] [data-testid=node-served]`)?.dataset.tokens === String(total),
        [bId, r.json.usage.total_tokens],
      );
      assert.equal(await served.getAttribute('data-requests'), '1');
      assert.equal(await page.locator('[data-testid=node-card][data-self=true] [data-testid=node-served]').getAttribute('data-tokens'), '0');
    });
  } finally {
    if (b) await killServer(b.proc);
    await killServer(a.proc);
  }
});

test('conversations and their settings persist across reloads and can be deleted', async () => {
  await withPage('persistence', {}, async (page) => {
    await newChat(page, { maxTokens: '3', system: 'You are terse.' });
    await send(page, 'Hello there');
    await waitFinish(page);
    await page.reload();
    const item = page.getByTestId('conversation-item').first();
    await item.waitFor();
    assert.equal(await item.innerText().then((t) => t.replace('×', '').replace('✎', '').trim()), 'Hello there');
    assert.equal(await page.getByTestId('message-user').count(), 1);
    assert.equal(await page.getByTestId('message-assistant').getByTestId('finish-badge').getAttribute('data-finish'), 'length');
    await page.getByTestId('settings-toggle').click();
    assert.equal(await page.getByTestId('setting-max-tokens').inputValue(), '3');
    assert.equal(await page.getByTestId('setting-system').inputValue(), 'You are terse.');
    const id = Number(await item.getAttribute('data-server-id'));
    const stored = await storedConversation(id);
    assert.equal(stored.title, 'Hello there');
    assert.equal(stored.settings.maxTokens, 3);
    assert.equal(stored.settings.systemPrompt, 'You are terse.');

    // Deleting it removes it from the list, from the store, and so after a reload.
    const before = await page.getByTestId('conversation-item').count();
    // Deleting asks first, in place: Keep leaves the chat, Delete removes it.
    await item.hover();
    await item.getByTestId('delete-conversation').click();
    await item.getByTestId('delete-conversation-no').click();
    assert.equal(await page.getByTestId('conversation-item').count(), before);
    await item.getByTestId('delete-conversation').click();
    assert.equal(await page.getByTestId('conversation-item').count(), before, 'not deleted before it is confirmed');
    await item.getByTestId('delete-conversation-yes').click();
    assert.equal(await page.getByTestId('conversation-item').count(), before - 1);
    const deadline = Date.now() + 10_000;
    while (await storedConversation(id)) {
      assert.ok(Date.now() < deadline, `conversation ${id} still in the store`);
      await new Promise((r) => setTimeout(r, 100));
    }
    await page.reload();
    await page.locator('[data-testid=conversation-list][data-loaded=true]').waitFor();
    assert.equal(await page.locator(`[data-testid=conversation-item][data-server-id="${id}"]`).count(), 0);
    assert.equal(await page.getByTestId('conversation-item').count(), before - 1);
    assert.equal((await api(`/v1/conversations/${id}`, undefined, 'DELETE')).status, 404);
  });
});

test('the chat list: search by title or message, chats grouped by when they were used, rename kept by the store', async () => {
  const word = `zebra${Date.now()}`;
  const conv = await api('/v1/conversations', {
    title: 'A chat to find',
    settings: { model: '', systemPrompt: '', temperature: 0, maxTokens: null, stop: [], reasoning: false },
  });
  assert.equal(conv.status, 200, conv.text);
  const id = conv.json.id;
  assert.equal((await api(`/v1/conversations/${id}/messages`, { role: 'user', content: `about the ${word} crossing` })).status, 200);
  await withPage('chat-list', {}, async (page) => {
    const item = page.locator(`[data-testid=conversation-item][data-server-id="${id}"]`);
    await item.waitFor();
    const groupOf = (loc) => loc.evaluate((el) => el.closest('[data-testid=chat-group]').dataset.group);
    assert.equal(await groupOf(item), 'Today');
    // A word of a message finds the chat; words nothing holds say so.
    await page.getByTestId('chat-search').fill(word.toUpperCase());
    await page.waitForFunction(() => document.querySelectorAll('[data-testid=conversation-item]').length === 1);
    assert.equal(await item.count(), 1);
    await page.getByTestId('chat-search').fill(`${word} nowhere`);
    await page.getByTestId('chat-search-empty').waitFor();
    await page.getByTestId('chat-search').fill('');
    // Rename: Esc leaves it, Enter keeps the new name, in the list and the store.
    await item.hover();
    await item.getByTestId('rename-conversation').click();
    await page.getByTestId('rename-input').fill('Not this');
    await page.getByTestId('rename-input').press('Escape');
    assert.equal(await item.locator('.conv-title').innerText(), 'A chat to find');
    await item.locator('.conv-title').dblclick();
    await page.getByTestId('rename-input').fill('  Zebra   notes ');
    const written = page.waitForResponse((r) => r.url().endsWith(`/v1/conversations/${id}`) && r.request().method() === 'PATCH');
    await page.getByTestId('rename-input').press('Enter');
    assert.equal(await item.locator('.conv-title').innerText(), 'Zebra notes');
    // Once the store has answered the rename, it holds the new title.
    assert.equal((await written).status(), 200);
    assert.equal((await storedConversation(id)).title, 'Zebra notes');
  });
  // A chat last used three days ago (as the store would list it) is under "Previous 7 days".
  const setup = (page) =>
    page.route('**/v1/conversations', async (r) => {
      if (r.request().method() !== 'GET') return r.continue();
      const res = await r.fetch();
      const json = await res.json();
      for (const c of json.data) if (c.id === id) c.updated_ms = Date.now() - 3 * 86_400_000;
      await r.fulfill({ response: res, json });
    });
  await withPage('chat-list-groups', { setup }, async (page) => {
    const item = page.locator(`[data-testid=conversation-item][data-server-id="${id}"]`);
    await item.waitFor();
    assert.equal(await item.evaluate((el) => el.closest('[data-testid=chat-group]').dataset.group), 'Previous 7 days');
    const groups = await page.getByTestId('chat-group').evaluateAll((gs) => gs.map((g) => g.dataset.group));
    assert.deepEqual(groups, ['Today', 'Yesterday', 'Previous 7 days', 'Previous 30 days', 'Older'].filter((g) => groups.includes(g)), 'newest first');
  });
});

test('"+ New chat" reuses an empty chat instead of piling up empty ones', async () => {
  await withPage('new-chat-reuse', {}, async (page) => {
    await page.getByTestId('model-picker').locator('option').first().waitFor({ state: 'attached' });
    if (page.viewportSize().width <= 720) await page.getByTestId('sidebar-toggle').click();
    const empties = () => page.locator('[data-testid=conversation-item]', { hasText: 'New chat' });
    await page.getByTestId('new-chat').click();
    const before = await page.getByTestId('conversation-item').count();
    for (let i = 0; i < 3; i++) await page.getByTestId('new-chat').click();
    assert.equal(await page.getByTestId('conversation-item').count(), before, 'no new empty chats');
    assert.equal(await empties().count(), 1);
    assert.equal(await empties().first().evaluate((el) => el.classList.contains('active')), true);
    // Once something is sent, the next "+ New chat" is a new chat.
    await newChat(page, { maxTokens: '2' });
    await send(page, 'Hi');
    await waitFinish(page);
    await page.getByTestId('new-chat').click();
    assert.equal(await page.getByTestId('conversation-item').count(), before + 1);
    assert.equal(await empties().count(), 1);
  });
});

test('a chat has an address: it can be linked, and a reload shows the same chat', async () => {
  let id;
  await withPage('chat-url', {}, async (page) => {
    await newChat(page, { maxTokens: '3' });
    await send(page, 'Name a colour.');
    await waitFinish(page);
    id = await currentServerId(page);
    await page.waitForURL((u) => u.pathname === `/chat/${id}`);
    // Another chat moves the address; a reload of the first address shows the first chat.
    await newChat(page, { maxTokens: '2' });
    await send(page, 'Hi');
    await waitFinish(page);
    const other = await currentServerId(page);
    assert.notEqual(other, id);
    await page.waitForURL((u) => u.pathname === `/chat/${other}`);
    await page.goto(new URL(`/chat/${id}`, page.url()).toString());
    await page.locator(`[data-testid=conversation-item][data-server-id="${id}"].active`).waitFor();
    assert.equal((await page.getByTestId('user-content').first().innerText()).trim(), 'Name a colour.');
  });
  // A fresh page opened on the link.
  await withPage('chat-url-link', { path: `/chat/${id}` }, async (page) => {
    await page.locator(`[data-testid=conversation-item][data-server-id="${id}"].active`).waitFor();
    assert.equal(new URL(page.url()).pathname, `/chat/${id}`);
  });
  // A link to a chat the store does not have says so; it opens no other chat and keeps the address.
  const gone = id + 1_000_000;
  await withPage('chat-url-missing', { path: `/chat/${gone}` }, async (page) => {
    await page.locator('[data-testid=conversation-list][data-loaded=true]').waitFor();
    await page.getByTestId('chat-not-found').waitFor();
    assert.equal(await page.locator('[data-testid=conversation-item].active').count(), 0);
    assert.equal(new URL(page.url()).pathname, `/chat/${gone}`);
    await page.getByTestId('chat-not-found-new').click();
    await page.getByTestId('empty-chat').waitFor();
    assert.equal(await page.getByTestId('chat-not-found').count(), 0);
  });
});

test('a new chat keeps the model but not the last chat\'s own settings', async () => {
  await withPage('new-chat-settings', {}, async (page) => {
    await newChat(page, { maxTokens: '7', stop: 'END', system: 'Answer in French.', temperature: '0.5' });
    await send(page, 'Hi');
    await waitFinish(page);
    const model = await page.getByTestId('model-picker').inputValue();
    await page.getByTestId('new-chat').click();
    if ((await page.getByTestId('settings-panel').count()) === 0) await page.getByTestId('settings-toggle').click();
    assert.equal(await page.getByTestId('setting-max-tokens').inputValue(), '1024');
    assert.equal(await page.getByTestId('setting-stop').inputValue(), '');
    assert.equal(await page.getByTestId('setting-system').inputValue(), '');
    assert.equal(await page.getByTestId('setting-temperature').inputValue(), '');
    assert.equal(await page.getByTestId('model-picker').inputValue(), model);
  });
});

test('markdown renders code blocks and strips active content', async () => {
  // A conversation written to the store by another client (this test).
  const conv = await api('/v1/conversations', {
    title: 'markdown',
    settings: { model: '', systemPrompt: '', temperature: 0, maxTokens: null, stop: [], reasoning: false },
  });
  assert.equal(conv.status, 200, conv.text);
  const id = conv.json.id;
  const user = await api(`/v1/conversations/${id}/messages`, { role: 'user', content: 'show code' });
  assert.equal(user.status, 200, user.text);
  const reply = await api(`/v1/conversations/${id}/messages`, {
    role: 'assistant',
    content:
      'Here is **bold** and `inline`.\n\n```python\nprint("<b>hi</b>")\n```\n\n<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>[link](javascript:window.__pwned=3)',
    metadata: { client_finish: 'stop' },
  });
  assert.equal(reply.status, 200, reply.text);
  await withPage('markdown', {}, async (page) => {
    const item = page.locator(`[data-testid=conversation-item][data-server-id="${id}"]`);
    await item.locator('.conv-title').click();
    const md = lastReply(page).getByTestId('assistant-content');
    await md.waitFor();
    assert.equal(await lastReply(page).getByTestId('finish-badge').getAttribute('data-finish'), 'stop');
    assert.equal(await md.locator('strong').innerText(), 'bold');
    assert.equal((await md.locator('pre code').innerText()).trim(), 'print("<b>hi</b>")');
    assert.equal(await md.locator('img, script').count(), 0);
    const hrefs = await md.locator('a').evaluateAll((as) => as.map((a) => a.getAttribute('href') ?? ''));
    assert.ok(hrefs.every((h) => !h.startsWith('javascript:')), JSON.stringify(hrefs));
    assert.equal(await page.evaluate(() => window.__pwned), undefined);
  });
});

test('a reply keeps its usage figures and finish badge across a reload', async () => {
  await withPage('reload', {}, async (page) => {
    await newChat(page, { maxTokens: '5' });
    await send(page, FRANCE);
    assert.equal(await waitFinish(page), 'length');
    const id = await currentServerId(page);
    const reply = lastReply(page);
    const responseId = await reply.getAttribute('data-response-id');
    const before = await shownStats(reply);
    assert.equal(before.live, false);
    assert.equal(before.completion, 5);
    const entry = await ledgerEntry(responseId);
    assert.deepEqual(
      { prompt: before.prompt, cached: before.cached, completion: before.completion, reasoning: before.reasoning, total: before.total },
      usageFigures(entry.usage),
    );

    await page.reload();
    const item = page.locator(`[data-testid=conversation-item][data-server-id="${id}"]`);
    await item.waitFor();
    assert.equal(await item.evaluate((el) => el.classList.contains('active')), true, 'the newest chat is shown');
    assert.equal(await item.locator('.conv-title').innerText(), FRANCE_TITLE);
    assert.equal(await item.locator('.conv-title').getAttribute('title'), FRANCE, 'the whole title on hover');
    const again = lastReply(page);
    await again.getByTestId('finish-badge').waitFor();
    assert.equal(await again.getAttribute('data-response-id'), responseId);
    assert.equal(await again.getByTestId('finish-badge').getAttribute('data-finish'), 'length');
    assert.equal(await page.getByTestId('user-content').innerText(), FRANCE);
    const after = await shownStats(again);
    assert.deepEqual(after, before, 'the same figures as before the reload');
    // Each message's time is the store's.
    const stored = (await storedConversation(id)).messages;
    assert.deepEqual(
      await page.locator('[data-testid=message-user], [data-testid=message-assistant]').evaluateAll((ms) => ms.map((m) => Number(m.dataset.created))),
      [...stored].sort((a, b) => a.seq - b.seq).map((m) => m.created_ms),
    );
    await screenshot(page, 'reload-restored');

    // The settings came back too, and the chat goes on from there.
    await page.getByTestId('settings-toggle').click();
    assert.equal(await page.getByTestId('setting-max-tokens').inputValue(), '5');
    assert.equal(await page.getByTestId('setting-temperature').inputValue(), '0');
    const body = await send(page, 'And of Germany?');
    assert.deepEqual(body.messages.map((m) => m.role), ['user', 'assistant', 'user']);
    assert.equal(body.max_tokens, 5);
    await waitFinish(page);
    assert.equal((await storedConversation(id)).messages.length, 4);
  });
});

test('the store keeps what the server recorded for a reply, not what a client claims', async () => {
  await withPage('store-metadata', {}, async (page) => {
    await newChat(page, { maxTokens: '3' });
    await send(page, 'Tell me a story');
    assert.equal(await waitFinish(page), 'length');
    const responseId = await lastReply(page).getAttribute('data-response-id');
    const id = await currentServerId(page);
    const entry = await ledgerEntry(responseId);

    const conv = await storedConversation(id);
    assert.ok(conv, `conversation ${id} listed by GET /v1/conversations`);
    assert.equal(conv.title, 'Tell me a story');
    assert.equal(conv.settings.maxTokens, 3);
    assert.deepEqual(conv.messages.map((m) => m.role), ['user', 'assistant']);
    assert.equal(conv.messages[0].pieces[0].text, 'Tell me a story');
    const stored = conv.messages[1];
    assert.equal(stored.target, 'openai.chat');
    assert.equal(stored.model, model);
    const meta = stored.pieces[0].metadata;
    const usage = {
      prompt: entry.usage.prompt_tokens,
      completion: entry.usage.completion_tokens,
      total: entry.usage.total_tokens,
      cached: entry.usage.prompt_tokens_details?.cached_tokens,
      reasoning: entry.usage.completion_tokens_details?.reasoning_tokens,
    };
    assert.deepEqual(
      {
        prompt: meta.token_usage_prompt_tokens,
        completion: meta.token_usage_completion_tokens,
        total: meta.token_usage_total_tokens,
        cached: meta.token_usage_cached_tokens,
        reasoning: meta.token_usage_reasoning_tokens,
      },
      usage,
    );
    assert.equal(usage.completion, 3);
    assert.equal(meta.finish_reason, entry.finish_reasons[0]);
    assert.equal(meta.finish_reason, 'length');
    assert.equal(meta.engine_finish_reason, entry.engine_finish_reasons[0]);
    assert.equal(meta.response_id, responseId);
    assert.equal(meta.client_finish, 'length', 'the UI adds what it saw under its own keys');

    // A client posting the same response id with forged reserved keys: the
    // server's own figures win, the client's own keys are kept.
    const forged = await api(`/v1/conversations/${id}/messages`, {
      role: 'assistant',
      content: 'forged',
      response_id: responseId,
      metadata: {
        finish_reason: 'stop',
        token_usage_prompt_tokens: 99999,
        token_usage_completion_tokens: 1,
        engine_finish_reason: 'stop',
        ttft_ms: 0.001,
        client_note: 'kept',
      },
    });
    assert.equal(forged.status, 200, forged.text);
    const fm = forged.json.pieces[0].metadata;
    assert.equal(fm.finish_reason, 'length');
    assert.equal(fm.token_usage_prompt_tokens, usage.prompt);
    assert.equal(fm.token_usage_completion_tokens, usage.completion);
    assert.equal(fm.engine_finish_reason, entry.engine_finish_reasons[0]);
    assert.notEqual(fm.ttft_ms, 0.001);
    assert.equal(fm.client_note, 'kept');
    // Without a response id the forged keys are dropped and nothing takes their place.
    const bare = await api(`/v1/conversations/${id}/messages`, {
      role: 'assistant',
      content: 'forged too',
      metadata: { finish_reason: 'stop', token_usage_prompt_tokens: 99999, client_note: 'kept' },
    });
    assert.equal(bare.status, 200, bare.text);
    const bm = bare.json.pieces[0].metadata;
    assert.deepEqual(Object.keys(bm).filter((k) => k === 'finish_reason' || k.startsWith('token_usage_')), []);
    assert.equal(bm.client_note, 'kept');
    const listed = (await storedConversation(id)).messages.map((m) => m.pieces[0].metadata);
    assert.equal(listed[2].token_usage_prompt_tokens, usage.prompt);
    assert.equal(listed[3].token_usage_prompt_tokens, undefined);

    // Deleting from the first forged message drops both.
    const cut = await api(`/v1/conversations/${id}/messages/${forged.json.id}`, undefined, 'DELETE');
    assert.equal(cut.status, 200, cut.text);
    assert.deepEqual(cut.json, { deleted: 2 });
    assert.equal((await storedConversation(id)).messages.length, 2);
  });
});

test('a reply stopped before the server answered keeps the finish the UI saw', async () => {
  // The chat request is held (never answered), so the server has no ledger
  // entry for it: the store keeps the UI's own `client_finish`.
  const held = [];
  const setup = (page) => page.route(/\/v1\/chat\/completions$/, (route) => void held.push(route));
  await withPage('cancel-before-reply', { setup }, async (page) => {
    await newChat(page);
    await send(page, FRANCE);
    await page.getByTestId('stop-button').click();
    assert.equal(await waitFinish(page), 'cancelled');
    const reply = lastReply(page);
    assert.equal(await reply.getAttribute('data-response-id'), '');
    const before = await shownStats(reply);
    const id = await currentServerId(page);
    const meta = (await storedConversation(id)).messages[1].pieces[0].metadata;
    assert.equal(meta.client_finish, 'cancelled');
    assert.equal(meta.finish_reason, undefined);
    assert.equal(meta.response_id, undefined);

    await page.reload();
    await page.locator(`[data-testid=conversation-item][data-server-id="${id}"].active`).waitFor();
    await lastReply(page).getByTestId('finish-badge').waitFor();
    assert.equal(await lastReply(page).getByTestId('finish-badge').getAttribute('data-finish'), 'cancelled');
    assert.deepEqual(await shownStats(lastReply(page)), before);
  });
  for (const r of held) await r.abort().catch(() => {});
});

test('a store that fails is said so plainly, the chat goes on and is saved once it works again', async () => {
  let failing = true;
  const setup = (page) =>
    page.route(/\/v1\/conversations/, (route) =>
      failing
        ? route.fulfill({
            status: 503,
            contentType: 'application/json',
            body: JSON.stringify({ error: { message: 'store offline (test)', type: 'server_error', code: null } }),
          })
        : route.continue(),
    );
  await withPage('store-error', { setup }, async (page) => {
    await page.getByTestId('store-load-error').waitFor();
    assert.match(await page.getByTestId('store-load-error').innerText(), /Cannot load your conversations: 503: store offline \(test\)/);
    await newChat(page);
    await send(page, FRANCE);
    assert.equal(await waitFinish(page, 120_000, { saved: false }), 'stop');
    assert.equal(await lastReply(page).getByTestId('assistant-content').innerText(), 'The capital of France is Paris.');
    await page.getByTestId('store-error').waitFor();
    assert.match(await page.getByTestId('store-error').innerText(), /503: store offline \(test\)/);
    await page.getByTestId('not-saved').first().waitFor();
    await screenshot(page, 'store-error-shown');

    // The store is back: the next message writes the chat and everything before it.
    failing = false;
    await page.getByTestId('store-load-error').getByRole('button', { name: 'Retry' }).click();
    await page.getByTestId('store-load-error').waitFor({ state: 'detached' });
    await send(page, 'And of Germany?');
    await waitFinish(page);
    assert.equal(await page.getByTestId('not-saved').count(), 0);
    const id = await currentServerId(page);
    const stored = await storedConversation(id);
    assert.equal(stored.title, FRANCE_TITLE);
    assert.deepEqual(
      stored.messages.map((m) => [m.role, m.pieces[0].text]),
      [
        ['user', FRANCE],
        ['assistant', 'The capital of France is Paris.'],
        ['user', 'And of Germany?'],
        ['assistant', await lastReply(page).getByTestId('assistant-content').innerText()],
      ],
    );
  });
});

test('small tag text reads at WCAG AA contrast in both schemes', async () => {
  await withPage('tag-contrast', {}, async (page) => {
    await openModels(page);
    await page.locator('.tag').first().waitFor();
    for (const scheme of ['light', 'dark']) {
      await page.evaluate((s) => { document.documentElement.dataset.scheme = s; }, scheme);
      const ratios = await page.evaluate(() => {
        const rgb = (c) => (c.match(/[\d.]+/g) || []).map(Number);
        const lum = ([r, g, b]) => {
          const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
          return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
        };
        const bgOf = (el) => {
          for (let e = el; e; e = e.parentElement) {
            const c = rgb(getComputedStyle(e).backgroundColor);
            if (c.length === 3 || (c.length === 4 && c[3] > 0)) return c.slice(0, 3);
          }
          return [255, 255, 255];
        };
        return [...document.querySelectorAll('.tag')]
          .filter((t) => t.offsetParent !== null)
          .map((t) => {
            const [a, b] = [lum(rgb(getComputedStyle(t).color).slice(0, 3)), lum(bgOf(t))];
            return { text: t.textContent.trim(), ratio: (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05) };
          });
      });
      assert.ok(ratios.length > 0, 'tags on the page');
      for (const r of ratios) assert.ok(r.ratio >= 4.5, `${scheme}: "${r.text}" at ${r.ratio.toFixed(2)}:1`);
    }
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
    // Following the system again: a change of its scheme shows at once.
    assert.equal(await bg(), dark);
    await page.emulateMedia({ colorScheme: 'light' });
    await page.waitForFunction(() => document.documentElement.dataset.scheme === 'light');
    assert.equal(await bg(), light);
  });
});

// ---- Models: the picker, downloads from the loopback hub (tests/run-ui.sh
// starts shoal-hub-fixture with test/SmolLM2-GGUF), disk use, load / unload /
// delete. These run last and in order: the pull adds a model the later ones use.

const HUB_REPO = 'test/SmolLM2-GGUF';
let pulledId;

/** Bytes as the UI writes them (format.ts): one decimal below 100 of a unit. */
function shownBytes(b) {
  const units = ['B', 'KiB', 'MiB', 'GiB'];
  let v = b;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)} ${units[i]}`;
}

const escapeRe = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** GET /v1/models: the models (aliases apart) and the server's figures. */
async function serverModels() {
  const res = await api('/v1/models');
  assert.equal(res.status, 200, res.text);
  const all = res.json.data;
  return {
    models: all.filter((m) => m.shoal?.alias_of === undefined),
    aliases: all.filter((m) => m.shoal?.alias_of !== undefined),
    summary: res.json.shoal,
  };
}

async function pickerOptions(page) {
  return page.getByTestId('model-picker').locator('option').evaluateAll((os) =>
    os.map((o) => ({ value: o.value, text: o.textContent, quant: o.dataset.quant, size: o.dataset.size, loaded: o.dataset.loaded, source: o.dataset.source })),
  );
}

async function openModels(page) {
  if ((await page.getByTestId('models-panel').count()) === 0) await page.getByTestId('models-toggle').click();
  await page.getByTestId('models-panel').waitFor();
  await page.waitForFunction(() => document.querySelectorAll('[data-testid=model-row]').length > 0);
}

const modelRow = (page, id) => page.locator(`[data-testid=model-row][data-id="${id}"]`);

/** Polls until `check` holds for the server's model list (loads and unloads settle in the background). */
async function waitModels(check, what, timeoutMs = 15_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const m = await serverModels();
    if (check(m)) return m;
    assert.ok(Date.now() < deadline, `timed out waiting for: ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

test('the model picker lists the configured model with its quantization, size and load state, not its aliases', async () => {
  const { models, aliases, summary } = await serverModels();
  const configured = models.find((m) => m.shoal.source.kind === 'path');
  assert.ok(configured, 'the configured model is listed');
  assert.equal(configured.id, model);
  assert.equal(configured.shoal.quantization, 'Q4_1');
  assert.equal(configured.shoal.loaded, true);
  assert.ok(aliases.some((a) => a.shoal.alias_of === configured.id), 'run-ui.sh starts the server with an alias');
  await withPage('models-picker', {}, async (page) => {
    await page.waitForFunction(() => document.querySelector('[data-testid=model-picker]')?.value);
    const options = await pickerOptions(page);
    assert.deepEqual(
      options.map((o) => o.value),
      models.filter((m) => m.shoal.kind === 'chat').map((m) => m.id),
      'one option per chat model, aliases and embedding models left out',
    );
    const opt = options.find((o) => o.value === configured.id);
    assert.equal(opt.quant, 'Q4_1');
    assert.equal(Number(opt.size), configured.shoal.size_bytes);
    assert.equal(opt.loaded, 'true');
    assert.equal(opt.source, 'path');
    assert.match(opt.text, /Q4_1/);
    assert.equal(opt.text.split('Q4_1').length - 1, 1, `the quantization once: ${opt.text}`);
    assert.equal(await page.getByTestId('model-picker').getAttribute('title'), opt.text, 'the whole label on hover');
    assert.ok(opt.text.includes(`Q4_1 · ${shownBytes(configured.shoal.size_bytes)}`), `size on disk in ${opt.text}`);
    assert.ok(opt.text.includes(`loaded, ${shownBytes(configured.shoal.memory_bytes)}`), `memory in ${opt.text}`);
    assert.equal(configured.shoal.backend, BACKEND, `run-ui.sh serves on ${BACKEND}`);
    assert.ok(opt.text.endsWith(BACKEND === 'llama' ? 'on llama.cpp' : 'on MLX'), `engine in ${opt.text}`);
    assert.equal(await page.getByTestId('model-picker').inputValue(), configured.id, 'the configured model is the initial choice');
    assert.equal(await page.getByTestId('model-state-chosen').getAttribute('data-loaded'), 'true');

    // The panel: the same figures, disk use of the library, no delete for the configured file.
    await openModels(page);
    const row = modelRow(page, configured.id);
    assert.equal(await page.getByTestId('model-row').count(), models.length);
    assert.equal(await row.getAttribute('data-loaded'), 'true');
    assert.equal(await row.getAttribute('data-source'), 'path');
    assert.equal(await row.getAttribute('data-selected'), 'true');
    assert.equal(await row.getByTestId('model-quant').innerText(), 'Q4_1');
    assert.equal(await row.getByTestId('model-backend').getAttribute('data-backend'), BACKEND);
    assert.equal(await row.getByTestId('model-backend').innerText(), BACKEND === 'llama' ? 'llama.cpp' : 'MLX');
    assert.equal(Number(await row.getByTestId('model-size').getAttribute('data-bytes')), configured.shoal.size_bytes);
    assert.equal(await row.getByTestId('model-size').innerText(), shownBytes(configured.shoal.size_bytes));
    assert.equal(Number(await row.getByTestId('model-memory').getAttribute('data-bytes')), configured.shoal.memory_bytes);
    assert.equal(await row.getByTestId('model-state').innerText(), 'loaded');
    assert.match(await row.getByTestId('model-source').innerText(), /configured model file/);
    assert.equal(await row.getByTestId('model-delete').count(), 0);
    assert.equal(await row.getByTestId('model-in-use').count(), 1);
    const disk = page.getByTestId('library-bytes');
    assert.equal(Number(await disk.getAttribute('data-bytes')), summary.library_bytes);
    const hub = models.filter((m) => m.shoal.source.kind === 'hub').length;
    const all = models.reduce((sum, m) => sum + m.shoal.size_bytes, 0);
    assert.equal(Number(await disk.getAttribute('data-all-bytes')), all);
    assert.match(
      await disk.innerText(),
      new RegExp(`^On disk: ${shownBytes(all)} in ${models.length} models, ${hub ? `${hub} downloaded from the hub` : 'none downloaded from the hub'}`),
    );
  });
});

test('an embedding model is listed in Models but not offered for chats, and its requests are in the usage dashboard', async () => {
  const { models } = await serverModels();
  const embed = models.find((m) => m.shoal.kind === 'embedding');
  assert.ok(embed, 'run-ui.sh names an embedding model');
  const r = await api('/v1/embeddings', { model: embed.id, input: ['hello world', 'A man is eating food.'] });
  assert.equal(r.status, 200, r.text);
  assert.deepEqual(r.json.usage, { prompt_tokens: 12, total_tokens: 12 });
  const entry = (await api('/v1/usage?dialect=embeddings&limit=1')).json.data[0];
  assert.equal(entry.model, embed.id);
  await withPage('embedding-model', {}, async (page) => {
    await page.waitForFunction(() => document.querySelector('[data-testid=model-picker]')?.value);
    const options = await pickerOptions(page);
    assert.ok(!options.some((o) => o.value === embed.id), 'not offered for a chat');
    await openModels(page);
    const row = modelRow(page, embed.id);
    await row.waitFor();
    assert.match(await row.getByTestId('model-kind').innerText(), /embedding · 384 dims · mean pooling/);
    assert.equal(await row.getByTestId('model-use').count(), 0, 'no Use button');
    assert.equal(await row.getByTestId('model-state').innerText(), 'loaded');
  });
  await withPage('usage-embeddings', { path: '/usage' }, async (page) => {
    await page.getByTestId('usage-updated').filter({ hasText: 'updated' }).waitFor();
    await page.getByTestId('usage-filter-dialect').selectOption('openai.embeddings');
    const row = page.locator(`[data-testid=usage-row][data-id="${entry.id}"]`);
    await row.waitFor();
    assert.equal(await row.getByTestId('usage-row-prompt').innerText(), '12');
    assert.equal(await row.getByTestId('usage-row-completion').innerText(), '0');
  });
});

test('downloading a model from the hub shows its progress up to 100% and adds it to the picker', async () => {
  const before = await serverModels();
  assert.ok(!before.models.some((m) => m.shoal.source.kind === 'hub'), 'the library starts empty (fresh HF_HOME)');
  await withPage('models-pull', {}, async (page) => {
    await openModels(page);
    // Every state the progress bar goes through, as the page shows it.
    await page.evaluate(() => {
      window.__progress = [];
      new MutationObserver(() => {
        const bar = document.querySelector('[data-testid=pull-progress]');
        if (!bar) return;
        const s = { pct: Number(bar.dataset.percent), bytes: Number(bar.dataset.bytes), total: Number(bar.dataset.total) };
        const last = window.__progress[window.__progress.length - 1];
        if (!last || last.pct !== s.pct || last.bytes !== s.bytes) window.__progress.push(s);
      }).observe(document.body, { subtree: true, childList: true, attributes: true });
    });
    const pullReq = page.waitForRequest((r) => r.url().endsWith('/v1/models/pull') && r.method() === 'POST');
    await page.getByTestId('pull-spec').fill(HUB_REPO);
    await page.getByTestId('pull-button').click();
    assert.deepEqual(JSON.parse((await pullReq).postData()), { model: HUB_REPO });
    const card = page.locator(`[data-testid=pull][data-spec="${HUB_REPO}"]`);
    await card.waitFor();
    // The plan names the file before the bytes arrive.
    await card.getByTestId('pull-file-name').waitFor();
    assert.equal(await card.getByTestId('pull-file-name').innerText(), 'SmolLM2-135M-Instruct.Q4_1.gguf');
    await page.locator(`[data-testid=pull][data-spec="${HUB_REPO}"][data-status=done]`).waitFor({ timeout: 180_000 });

    const after = await serverModels();
    const pulled = after.models.find((m) => m.shoal.source.kind === 'hub');
    assert.ok(pulled, 'the server lists the pulled model');
    pulledId = pulled.id;
    assert.equal(pulled.shoal.source.repo, HUB_REPO);
    assert.equal(pulled.shoal.quantization, 'Q4_1');
    assert.equal(after.summary.library_bytes, pulled.shoal.size_bytes);

    const progress = await page.evaluate(() => window.__progress);
    const pcts = progress.map((p) => p.pct);
    assert.equal(pcts[pcts.length - 1], 100, JSON.stringify(pcts));
    assert.ok(pcts.every((p, i) => i === 0 || p >= pcts[i - 1]), `monotone: ${JSON.stringify(pcts)}`);
    assert.ok(pcts.some((p) => p > 0 && p < 100), `partial progress shown: ${JSON.stringify(pcts)}`);
    assert.ok(progress.some((p) => p.total === pulled.shoal.size_bytes), 'the total comes from the stream');
    assert.equal(await card.getByTestId('pull-progress').getAttribute('aria-valuenow'), '100');
    const size = shownBytes(pulled.shoal.size_bytes);
    assert.match(await card.getByTestId('pull-progress-text').innerText(), new RegExp(`^100%\\s+${escapeRe(size)} of ${escapeRe(size)}`));
    assert.ok((await card.getByTestId('pull-done').innerText()).includes(pulledId));
    assert.equal(await card.getByTestId('pull-error').count(), 0);

    // In the picker and the panel, with its hub source and size; the disk total follows.
    await page.locator(`[data-testid=model-picker] option[value="${pulledId}"]`).waitFor({ state: 'attached' });
    const opt = (await pickerOptions(page)).find((o) => o.value === pulledId);
    assert.equal(opt.source, 'hub');
    assert.equal(opt.quant, 'Q4_1');
    assert.equal(opt.loaded, 'false');
    const row = modelRow(page, pulledId);
    assert.equal(await row.getAttribute('data-source'), 'hub');
    assert.match(await row.getByTestId('model-source').innerText(), new RegExp(`hub: ${HUB_REPO} @ ${pulled.shoal.source.commit.slice(0, 7)}`));
    assert.equal(Number(await row.getByTestId('model-size').getAttribute('data-bytes')), pulled.shoal.size_bytes);
    assert.equal(await row.getByTestId('model-state').innerText(), 'not loaded');
    // Not loaded yet, the panel already says which engine would run it.
    assert.equal(await row.getByTestId('model-backend').getAttribute('data-backend'), pulled.shoal.backend);
    assert.ok(['mlx', 'llama'].includes(pulled.shoal.backend), pulled.shoal.backend);
    assert.equal(await row.getByTestId('model-delete').count(), 1);
    await page.waitForFunction(
      (want) => document.querySelector('[data-testid=library-bytes]')?.dataset.bytes === String(want),
      pulled.shoal.size_bytes,
    );
    assert.ok((await page.getByTestId('library-bytes').innerText()).includes(`1 downloaded from the hub (${size})`));
    await screenshot(page, 'models-pulled');
  });
});

test('a chat on the pulled model loads it on first use, and the choice stays with the conversation', async () => {
  assert.ok(pulledId, 'the pull test ran first');
  await withPage('models-chat', {}, async (page) => {
    await newChat(page);
    await page.getByTestId('model-picker').selectOption(pulledId);
    const chosen = page.getByTestId('model-state-chosen');
    assert.equal(await chosen.getAttribute('data-loaded'), 'false', 'not in memory yet');
    assert.match(await chosen.getAttribute('title'), /loads with the next message/);
    const body = await send(page, FRANCE);
    assert.equal(body.model, pulledId);
    assert.equal(await waitFinish(page), 'stop');
    const reply = lastReply(page);
    // The same weights as the configured model: the same greedy answer.
    assert.equal(await reply.getByTestId('assistant-content').innerText(), 'The capital of France is Paris.');
    const entry = await ledgerEntry(await reply.getAttribute('data-response-id'));
    assert.equal(entry.model, pulledId);
    const shown = await shownStats(reply);
    assert.equal(shown.live, false);
    assert.deepEqual(
      { prompt: shown.prompt, cached: shown.cached, completion: shown.completion, reasoning: shown.reasoning, total: shown.total },
      usageFigures(entry.usage),
    );
    assert.equal(await reply.getByTestId('finish-badge').getAttribute('data-finish'), 'stop');
    // Now in memory, and the page says so.
    const loaded = (await serverModels()).models.find((m) => m.id === pulledId);
    assert.equal(loaded.shoal.loaded, true);
    assert.ok(loaded.shoal.memory_bytes > 0);
    await page.locator('[data-testid=model-state-chosen][data-loaded=true]').waitFor();

    // Kept with the conversation: in the store and after a reload.
    const id = await currentServerId(page);
    const deadline = Date.now() + 10_000;
    while ((await storedConversation(id)).settings.model !== pulledId) {
      assert.ok(Date.now() < deadline, 'the model choice reached the store');
      await new Promise((r) => setTimeout(r, 100));
    }
    await page.reload();
    await page.locator(`[data-testid=conversation-item][data-server-id="${id}"].active`).waitFor();
    await page.locator(`[data-testid=model-picker] option[value="${pulledId}"]`).waitFor({ state: 'attached' });
    assert.equal(await page.getByTestId('model-picker').inputValue(), pulledId);
    await lastReply(page).getByTestId('finish-badge').waitFor();

    // Unload and load from the panel.
    await openModels(page);
    const row = modelRow(page, pulledId);
    assert.equal(await row.getAttribute('data-selected'), 'true');
    await row.getByTestId('model-unload').click();
    await page.locator(`[data-testid=model-row][data-id="${pulledId}"][data-loaded=false]`).waitFor();
    assert.equal((await serverModels()).models.find((m) => m.id === pulledId).shoal.loaded, false);
    assert.equal(await row.getByTestId('model-state').innerText(), 'not loaded');
    await row.getByTestId('model-load').click();
    await page.locator(`[data-testid=model-row][data-id="${pulledId}"][data-loaded=true]`).waitFor({ timeout: 60_000 });
    assert.equal((await serverModels()).models.find((m) => m.id === pulledId).shoal.loaded, true);
    assert.equal(await page.getByTestId('model-action-error').count(), 0);

    // A load the server refuses (here: answered by the test as the server
    // does when memory is short) shows the server's message.
    await row.getByTestId('model-unload').click();
    await page.locator(`[data-testid=model-row][data-id="${pulledId}"][data-loaded=false]`).waitFor();
    const message = `model '${pulledId}' needs about 0.50 GiB but only 0.10 GiB of RAM is free`;
    await page.route(/\/v1\/models\/.*\/load$/, (route) =>
      route.fulfill({
        status: 503,
        contentType: 'application/json',
        body: JSON.stringify({ error: { message, type: 'server_error', param: 'model', code: 'insufficient_memory' } }),
      }),
    );
    const loadReq = page.waitForRequest((r) => /\/load$/.test(r.url()));
    await row.getByTestId('model-load').click();
    assert.equal(new URL((await loadReq).url()).pathname, `/v1/models/${pulledId}/load`, 'the id verbatim, slashes kept');
    const err = page.getByTestId('model-action-error');
    await err.waitFor();
    assert.match(await err.innerText(), /Could not load/);
    assert.ok((await err.innerText()).includes(`503: ${message}`), await err.innerText());
    assert.equal(await row.getAttribute('data-loaded'), 'false');
    await screenshot(page, 'models-load-refused');
  });
});

test('a bad repo name and a repo the hub does not have are shown as errors and add nothing', async () => {
  const before = await serverModels();
  await withPage('models-pull-errors', {}, async (page) => {
    await openModels(page);
    const optionsBefore = await pickerOptions(page);

    await page.getByTestId('pull-spec').fill('not a repo');
    await page.getByTestId('pull-button').click();
    const bad = page.locator('[data-testid=pull][data-spec="not a repo"][data-status=error]');
    await bad.waitFor();
    const badDirect = await api('/v1/models/pull', { model: 'not a repo' });
    assert.equal(badDirect.status, 400);
    const badText = await bad.getByTestId('pull-error').innerText();
    assert.ok(badText.includes(`400: ${badDirect.json.error.message}`), `${badText} vs ${badDirect.json.error.message}`);
    assert.equal(await bad.getByTestId('pull-status').innerText(), 'failed');

    await page.getByTestId('pull-spec').fill('test/absent');
    await page.getByTestId('pull-button').click();
    const absent = page.locator('[data-testid=pull][data-spec="test/absent"][data-status=error]');
    await absent.waitFor({ timeout: 60_000 });
    // The hub's own message, as the server reports it without streaming.
    const absentDirect = await api('/v1/models/pull', { model: 'test/absent', stream: false });
    assert.equal(absentDirect.status, 404, absentDirect.text);
    assert.equal(absentDirect.json.error.code, 'hub_not_found');
    assert.equal(await absent.getByTestId('pull-error').innerText(), absentDirect.json.error.message);
    assert.match(absentDirect.json.error.message, /test\/absent/);
    await screenshot(page, 'models-pull-errors-shown');

    // Nothing was added, here or on the server.
    await page.getByTestId('models-toggle').click();
    await page.getByTestId('models-toggle').click();
    await openModels(page);
    assert.deepEqual((await pickerOptions(page)).map((o) => o.value), optionsBefore.map((o) => o.value));
    const after = await serverModels();
    assert.deepEqual(after.models.map((m) => m.id), before.models.map((m) => m.id));
    assert.equal(after.summary.library_bytes, before.summary.library_bytes);
    // Finished downloads can be dismissed.
    await bad.getByTestId('pull-dismiss').click();
    await bad.waitFor({ state: 'detached' });
  });
});

test('the models panel fits a narrow window', async () => {
  await withPage('models-narrow', { width: 400, height: 800, colorScheme: 'dark' }, async (page) => {
    await openModels(page);
    assert.equal(await page.getByTestId('model-row').count(), (await serverModels()).models.length);
    const fits = await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth);
    assert.ok(fits, 'no horizontal page scrolling at 400px (the table scrolls in its own box)');
    const button = await page.getByTestId('pull-button').boundingBox();
    assert.ok(button && button.x >= 0 && button.x + button.width <= 400, 'the download button is on screen');
    const toggle = await page.getByTestId('models-toggle').boundingBox();
    assert.ok(toggle && toggle.x + toggle.width <= 400, 'the Models button is on screen');
  });
});

test('deleting the pulled model asks first, then removes it from the picker, the server and the disk total', async () => {
  assert.ok(pulledId, 'the pull test ran first');
  await withPage('models-delete', {}, async (page) => {
    await openModels(page);
    const row = modelRow(page, pulledId);
    await row.waitFor();
    // The newest chat (the previous test's) uses it.
    assert.equal(await page.getByTestId('model-picker').inputValue(), pulledId);
    assert.equal(await row.getAttribute('data-selected'), 'true');
    // Cancel keeps it.
    await row.getByTestId('model-delete').click();
    await row.getByTestId('delete-confirm').waitFor();
    const size = (await serverModels()).models.find((m) => m.id === pulledId).shoal.size_bytes;
    assert.ok((await row.getByTestId('delete-confirm').innerText()).includes(`Delete ${shownBytes(size)}?`));
    await row.getByTestId('delete-confirm-no').click();
    assert.equal(await row.getByTestId('delete-confirm').count(), 0);
    assert.ok((await serverModels()).models.some((m) => m.id === pulledId));

    const del = page.waitForRequest((r) => r.method() === 'DELETE');
    await row.getByTestId('model-delete').click();
    await row.getByTestId('delete-confirm-yes').click();
    assert.equal(new URL((await del).url()).pathname, `/v1/models/${pulledId}`);
    await row.waitFor({ state: 'detached' });
    assert.equal(await page.locator(`[data-testid=model-picker] option[value="${pulledId}"]`).count(), 0);
    const after = await serverModels();
    assert.ok(!after.models.some((m) => m.id === pulledId), 'gone from /v1/models');
    assert.equal(after.summary.library_bytes, 0);
    assert.equal(await page.getByTestId('library-bytes').getAttribute('data-bytes'), '0');
    assert.equal((await api(`/v1/models/${pulledId}`)).status, 404);
    // A chat that used it goes back to the configured model.
    assert.equal(await page.getByTestId('model-picker').inputValue(), model);
    assert.equal(await page.getByTestId('model-action-error').count(), 0);
  });
});

test('a hub the server cannot reach is said plainly, with HF_ENDPOINT named, and Retry searches again', async () => {
  // The server's answer when its hub is unreachable (its status and words, as `/v1/hub/search` sends
  // them with no network), for the first search only; Retry then reaches the suite's hub.
  const unreachable = {
    error: {
      message: 'hub: cannot reach the hub: error sending request for url (http://127.0.0.1:9/api/models?search=smollm2&limit=20&full=true&sort=downloads)',
      type: 'server_error',
      param: null,
      code: null,
    },
  };
  for (const width of [1280, 420]) {
    let failed = 0;
    const setup = (page) =>
      page.route('**/v1/hub/search**', (r) => (failed++ === 0 ? r.fulfill({ status: 502, json: unreachable }) : r.continue()));
    await withPage(`models-hub-offline-${width}`, { width, setup }, async (page) => {
      await openModels(page);
      await page.getByTestId('hub-search').fill('smollm2');
      await page.getByTestId('hub-search-button').click();
      const error = page.getByTestId('hub-error');
      await error.waitFor();
      assert.equal(await error.getAttribute('data-offline'), 'true');
      assert.match(await error.innerText(), /cannot be reached from this server.*HF_ENDPOINT/s);
      assert.match(await page.getByTestId('hub-error-detail').innerText(), /cannot reach the hub/);
      // The long URL wraps inside the box.
      assert.ok(await error.evaluate((el) => el.scrollWidth <= el.clientWidth), 'the error box scrolls sideways');
      await page.getByTestId('hub-retry').click();
      await page.locator(`[data-testid=hub-result][data-id="${HUB_REPO}"]`).waitFor();
      assert.equal(await error.count(), 0);
    });
  }
});

test('finding a model on the hub: search by name, its files with quantization, size and fit, then download', async () => {
  const listing = (await api(`/v1/hub/files?repo=${encodeURIComponent(HUB_REPO)}`)).json;
  assert.ok(listing?.files?.length, JSON.stringify(listing));
  for (const width of [1280, 420]) {
    await withPage(`models-hub-${width}`, { width }, async (page) => {
      await openModels(page);
      await page.getByTestId('hub-search').fill('smollm2');
      await page.getByTestId('hub-search-button').click();
      const result = page.locator(`[data-testid=hub-result][data-id="${HUB_REPO}"]`);
      await result.waitFor();
      assert.equal(await page.getByTestId('hub-result').count(), 1);
      await result.getByTestId('hub-open').click();
      await page.locator(`[data-testid=hub-files][data-repo="${HUB_REPO}"]`).waitFor();
      // Each file as the server listed it: quantization, size, the pool's estimate once loaded and the fit.
      const rows = page.getByTestId('hub-file');
      assert.equal(await rows.count(), listing.files.length);
      for (const f of listing.files) {
        const row = page.locator(`[data-testid=hub-file][data-name="${f.name}"]`);
        assert.equal(await row.getByTestId('hub-file-quant').innerText(), f.quantization);
        assert.equal(Number(await row.getByTestId('hub-file-size').getAttribute('data-bytes')), f.size_bytes);
        assert.equal(await row.getByTestId('hub-file-size').innerText(), shownBytes(f.size_bytes));
        assert.equal(Number(await row.getByTestId('hub-file-memory').getAttribute('data-bytes')), f.estimated_memory_bytes);
        assert.equal(await row.getAttribute('data-fits'), String(f.fits));
        assert.equal(await row.getByTestId('hub-file-fit').innerText(), f.fits ? 'fits' : 'too big');
        await row.getByTestId('hub-file-download').scrollIntoViewIfNeeded();
        assert.ok(await row.getByTestId('hub-file-download').isVisible(), `Download of ${f.name} in view at ${width} px`);
      }
      // A name the hub does not have says so.
      await page.getByTestId('hub-back').click();
      await page.getByTestId('hub-search').fill('no-such-model');
      await page.getByTestId('hub-search-button').click();
      await page.getByTestId('hub-no-results').waitFor();
    });
  }
  // The estimate is the one the model gets once pulled, and Download pulls that file.
  const file = listing.files[0];
  await withPage('models-hub-download', {}, async (page) => {
    await openModels(page);
    await page.getByTestId('hub-search').fill('SmolLM2');
    await page.getByTestId('hub-search-button').click();
    await page.locator(`[data-testid=hub-result][data-id="${HUB_REPO}"]`).getByTestId('hub-open').click();
    const pullReq = page.waitForRequest((r) => r.url().endsWith('/v1/models/pull') && r.method() === 'POST');
    await page.locator(`[data-testid=hub-file][data-name="${file.name}"]`).getByTestId('hub-file-download').click();
    assert.deepEqual(JSON.parse((await pullReq).postData()), file.pull);
    await page.locator(`[data-testid=pull][data-status=done]`).first().waitFor({ timeout: 180_000 });
  });
  const pulled = (await serverModels()).models.find((m) => m.shoal.source.kind === 'hub');
  assert.ok(pulled, 'the file was pulled');
  assert.equal(pulled.shoal.estimated_memory_bytes, file.estimated_memory_bytes);
  assert.equal(pulled.shoal.size_bytes, file.size_bytes);
  // Leave the library as the suite found it.
  assert.equal((await api(`/v1/models/${pulled.id}`, undefined, 'DELETE')).status, 200);
});

test('every view at 1280 and 420 px: nothing wider than the window, a screenshot of each', async () => {
  const views = [
    { name: 'chat', path: '/', ready: 'chat-view' },
    { name: 'chat-settings', path: '/', ready: 'chat-view', open: ['settings-toggle', 'settings-panel'] },
    { name: 'chat-models', path: '/', ready: 'chat-view', open: ['models-toggle', 'models-panel'] },
    { name: 'usage', path: '/usage', ready: 'usage-view' },
    { name: 'cluster', path: '/cluster', ready: 'cluster-view' },
    { name: 'server', path: '/server', ready: 'server-settings' },
  ];
  for (const width of [1280, 420]) {
    for (const v of views) {
      await withPage(`view-${v.name}-${width}`, { path: v.path, width, height: 800 }, async (page) => {
        await page.getByTestId(v.ready).waitFor();
        // The chat's model picker has its models (the screenshot shows them, not "loading…").
        if (v.name.startsWith('chat')) {
          await page.waitForFunction(() => document.querySelector('[data-testid=model-picker]')?.value);
        }
        if (v.open) {
          const [toggle, panel] = v.open;
          if ((await page.getByTestId(panel).count()) === 0) await page.getByTestId(toggle).click();
          await page.getByTestId(panel).waitFor();
        }
        const over = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
        assert.equal(over, 0, `${v.name} at ${width} px is ${over} px wider than the window`);
      });
    }
  }
});
