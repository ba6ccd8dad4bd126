// The chat settings' sampling fields (the model's default and its source beside
// each, an override sent in the request, out-of-range values refused before
// sending), the side column that holds Settings and Models beside the
// conversation, and the Models rows in a narrow window. On a server of its own
// (its own store and model library): a new chat starts from the previous
// chat's settings, so the overrides set here must not reach other files' chats.
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { api, killServer, launch, stopServer, lastReply, newChat, openPage, screenshot, send, startServer, streamChat, usePage, waitFinish } from './helpers.js';

const FRANCE = 'What is the capital of France? Answer in one sentence.';

/** The sampling fields: the request field, the field's test id, a value it takes and values it refuses with why. */
const FIELDS = [
  { wire: 'temperature', id: 'setting-temperature', ok: 0.7, bad: [['2.5', /^Temperature must be at least 0 and at most 2, not 2\.5$/]] },
  {
    wire: 'top_p',
    id: 'setting-top-p',
    ok: 0.5,
    bad: [['0', /^Top P must be more than 0 and at most 1, not 0$/], ['1.5', /^Top P must be more than 0 and at most 1, not 1\.5$/]],
  },
  {
    wire: 'top_k',
    id: 'setting-top-k',
    ok: 40,
    bad: [['2.5', /^Top K must be a whole number of at least 0, not 2\.5$/], ['-1', /^Top K must be a whole number of at least 0, not -1$/]],
  },
  { wire: 'min_p', id: 'setting-min-p', ok: 0.05, bad: [['1.5', /^Min P must be at least 0 and at most 1, not 1\.5$/]] },
  {
    wire: 'repetition_penalty',
    id: 'setting-repetition-penalty',
    ok: 1.1,
    bad: [['0', /^Repetition penalty must be more than 0 and at most 100, not 0$/], ['101', /at most 100, not 101$/]],
  },
  { wire: 'seed', id: 'setting-seed', ok: 7, bad: [['-1', /^Seed must be a whole number of at least 0 and at most 9007199254740991, not -1$/], ['1.5', /whole number/]] },
];

let browser;
let server;
let model;
let defaults;

before(async () => {
  const dir = mkdtempSync(join(process.env.SHOAL_UI_TMP || '/tmp', 'settings-'));
  // Its model library too: the Models panel lists what this server has, nothing of the user's.
  process.env.HF_HOME = join(dir, 'hf-home');
  server = await startServer(['--db', join(dir, 'store.sqlite')]);
  const models = await api('/v1/models', undefined, 'GET', { base: server.url });
  assert.equal(models.status, 200, models.text);
  model = models.json.data[0].id;
  defaults = models.json.data[0].shoal.sampling_defaults;
  browser = await launch();
});

after(async () => {
  await browser?.close();
  if (server) await killServer(server.proc);
});

/** Runs `body` with a fresh page on this file's server; screenshots it on failure and checks no script error escaped. */
async function withPage(name, opts, body) {
  await usePage(await openPage(browser, { base: server.url, ...opts }), name, body, { shot: false });
}

/**
 * Sets every sampling field: `values[wire]`, else temperature 0 (greedy, as
 * the suite's chats) and the model's default for the rest (a new chat starts
 * from the previous chat's settings).
 */
async function setSampling(page, values = {}) {
  for (const f of FIELDS) await page.getByTestId(f.id).fill(String(values[f.wire] ?? (f.wire === 'temperature' ? '0' : '')));
}

test('every sampling setting names the model\'s default and where it came from beside its field', async () => {
  assert.deepEqual(Object.keys(defaults).sort(), ['min_p', 'repetition_penalty', 'temperature', 'top_k', 'top_p']);
  await withPage('settings-defaults', {}, async (page) => {
    await newChat(page);
    await setSampling(page, { temperature: '' });
    for (const f of FIELDS.filter((f) => f.wire !== 'seed')) {
      const want = defaults[f.wire];
      const input = page.getByTestId(f.id);
      assert.equal(await input.inputValue(), '', f.wire);
      assert.equal(Number(await input.getAttribute('data-default')), want.value, f.wire);
      assert.equal(await input.getAttribute('data-default-source'), want.source, f.wire);
      assert.equal(await input.getAttribute('placeholder'), `model default ${want.value}`, f.wire);
      // Shown as text beside the field, not only in a tooltip.
      const note = page.getByTestId(`${f.id}-default`);
      assert.ok(await note.isVisible(), `${f.wire}: its default is on screen`);
      const text = await note.innerText();
      assert.ok(text.includes(`default ${want.value}`) && text.includes(want.source), `${f.wire}: ${text}`);
    }
    // The default model's card gives temperature and top_p; the rest are Shoal's own.
    assert.match(await page.getByTestId('setting-temperature-default').innerText(), /model card \(HuggingFaceTB\/SmolLM2\)/);
    assert.match(await page.getByTestId('setting-top-k-default').innerText(), /^default 0 \(off\) · shoal default$/);
    // A seed has no default: each reply draws anew.
    assert.equal(await page.getByTestId('setting-seed').getAttribute('placeholder'), 'random');
    assert.match(await page.getByTestId('setting-seed-default').innerText(), /none, a new random draw each reply/);
  });
});

test('each sampling override is sent in the chat request, kept with the chat, and left out once cleared', async () => {
  await withPage('settings-overrides', {}, async (page) => {
    await newChat(page, { maxTokens: '8' });
    await setSampling(page, Object.fromEntries(FIELDS.map((f) => [f.wire, f.ok])));
    const body = await send(page, FRANCE);
    for (const f of FIELDS) assert.equal(body[f.wire], f.ok, f.wire);
    await waitFinish(page);
    // Kept with the conversation: a reload shows them again.
    await page.reload();
    await page.getByTestId('settings-toggle').click();
    for (const f of FIELDS) assert.equal(await page.getByTestId(f.id).inputValue(), String(f.ok), f.wire);
    // Cleared: the server applies the model's defaults.
    await setSampling(page, { temperature: '' });
    const again = await send(page, FRANCE);
    for (const f of FIELDS) assert.equal(again[f.wire], undefined, f.wire);
    assert.equal(again.max_tokens, 8);
    await waitFinish(page);
  });
});

test('a seed set in the chat makes the server sample the same reply again', async () => {
  await withPage('settings-seed', {}, async (page) => {
    await newChat(page, { maxTokens: '12' });
    await setSampling(page, { temperature: 1.5, seed: 7 });
    const body = await send(page, FRANCE);
    assert.equal(body.seed, 7);
    await waitFinish(page);
    const id = await lastReply(page).getAttribute('data-response-id');
    // What the store kept of the UI's reply: the raw text, as the server streamed it.
    const convs = (await api('/v1/conversations', undefined, 'GET', { base: server.url })).json.data;
    const shown = convs.flatMap((c) => c.messages).find((m) => m.role === 'assistant' && m.pieces[0]?.metadata?.response_id === id);
    assert.ok(shown, `the stored reply ${id}`);
    const again = await streamChat(body, server.url);
    assert.ok(again.content.length > 0);
    assert.equal(shown.pieces[0].text, again.content, 'the same seed and settings: the same sampled reply');
  });
});

// The form sends these three as llama.cpp's and vLLM's OpenAI servers take them.
test(
  'top_k, min_p and repetition_penalty sent as the form sends them change the reply',
  async () => {
    const base = { model, messages: [{ role: 'user', content: FRANCE }], max_tokens: 12, stream: true };
    const greedy = (await streamChat({ ...base, temperature: 0 }, server.url)).content;
    // Only the likeliest token left to draw from: the greedy reply, however hot.
    for (const only of [{ top_k: 1 }, { min_p: 1 }]) {
      const r = await streamChat({ ...base, temperature: 2, seed: 1, ...only }, server.url);
      assert.equal(r.content, greedy, JSON.stringify(only));
    }
    const penalised = await streamChat({ ...base, temperature: 0, repetition_penalty: 5 }, server.url);
    assert.notEqual(penalised.content, greedy, 'a heavy repetition penalty steers off the prompt\'s own words');
  },
);

test('presets: a chat\'s settings kept by name, applied, the start of new chats, and a reset to the model\'s defaults', async () => {
  await withPage('presets', {}, async (page) => {
    await newChat(page, { maxTokens: '12', system: 'Answer in one word.', stop: 'END', temperature: '0.3' });
    const fields = async () => ({
      system: await page.getByTestId('setting-system').inputValue(),
      max: await page.getByTestId('setting-max-tokens').inputValue(),
      temperature: await page.getByTestId('setting-temperature').inputValue(),
      stop: await page.getByTestId('setting-stop').inputValue(),
    });
    const terse = { system: 'Answer in one word.', max: '12', temperature: '0.3', stop: 'END' };
    const defaults = { system: '', max: '1024', temperature: '', stop: '' };
    await page.getByTestId('preset-save-as').click();
    await page.getByTestId('preset-name').fill('Terse');
    await page.getByTestId('preset-save').click();
    // Reset empties every field (the model's defaults apply); the preset brings them back.
    await page.getByTestId('reset-settings').click();
    assert.deepEqual(await fields(), defaults);
    await page.getByTestId('preset-pick').selectOption('Terse');
    assert.deepEqual(await fields(), terse);
    const body = await send(page, FRANCE);
    assert.equal(body.max_tokens, 12);
    assert.equal(body.temperature, 0.3);
    assert.deepEqual(body.stop, ['END']);
    assert.deepEqual(body.messages[0], { role: 'system', content: 'Answer in one word.' });
    // New chats start from the default preset, in this browser, after a reload too.
    await page.getByTestId('preset-default').selectOption('Terse');
    await page.getByTestId('new-chat').click();
    assert.deepEqual(await fields(), terse);
    await page.reload();
    await page.locator('[data-testid=conversation-list][data-loaded=true]').waitFor();
    await page.getByTestId('new-chat').click();
    if ((await page.getByTestId('settings-panel').count()) === 0) await page.getByTestId('settings-toggle').click();
    assert.equal(await page.getByTestId('preset-default').inputValue(), 'Terse');
    assert.deepEqual(await fields(), terse);
    // Back to the model's defaults for new chats.
    await page.getByTestId('preset-default').selectOption('');
    await page.getByTestId('composer-input').fill('x');
    await page.getByTestId('send-button').click();
    await waitFinish(page);
    await page.getByTestId('new-chat').click();
    assert.deepEqual(await fields(), defaults);
  });
});

test('a sampling value out of range is refused before sending, and the Send button says why', async () => {
  await withPage('settings-refused', {}, async (page) => {
    await newChat(page, { maxTokens: '4' });
    await setSampling(page);
    let sent = 0;
    page.on('request', (r) => {
      if (r.url().endsWith('/v1/chat/completions')) sent += 1;
    });
    await page.getByTestId('composer-input').fill(FRANCE);
    const sendButton = page.getByTestId('send-button');
    for (const f of FIELDS) {
      for (const [value, why] of f.bad) {
        await page.getByTestId(f.id).fill(value);
        const error = page.getByTestId(`${f.id}-error`);
        assert.match(await error.innerText(), why, `${f.wire} ${value}`);
        assert.equal(await page.getByTestId(f.id).getAttribute('aria-invalid'), 'true');
        assert.equal(await sendButton.isDisabled(), true, `${f.wire} ${value}: not sent`);
        assert.equal(await sendButton.getAttribute('title'), await error.innerText());
        // The reason is on screen beside Send too (a touch screen shows no title).
        assert.equal(await page.getByTestId('send-reason').innerText(), await error.innerText());
        await page.getByTestId('composer-input').press('Enter');
        await page.getByTestId(f.id).fill(String(f.ok));
        assert.equal(await error.count(), 0, `${f.wire} ${f.ok} is taken`);
        assert.equal(await sendButton.isDisabled(), false);
        assert.equal(await page.getByTestId('send-reason').count(), 0);
        await page.getByTestId(f.id).fill('');
      }
    }
    // Text that is not a number at all is refused too (the field alone holds it; the setting stays empty).
    await page.getByTestId('setting-seed').pressSequentially('--');
    assert.equal(await page.getByTestId('setting-seed-error').innerText(), 'Seed must be a number');
    assert.equal(await sendButton.getAttribute('title'), 'Seed must be a number');
    await page.getByTestId('composer-input').press('Enter');
    await page.getByTestId('setting-seed').fill('');
    assert.equal(sent, 0, 'nothing was sent while a value was refused');
    const body = await send(page, FRANCE);
    assert.equal(body.seed, undefined);
    await waitFinish(page);
  });
});

/** The box of `testid` (the first) once scrolled into view, asserted inside the window. */
async function onScreen(page, testid, viewport) {
  const el = page.getByTestId(testid).first();
  await el.scrollIntoViewIfNeeded();
  const box = await el.boundingBox();
  assert.ok(box, `${testid} is shown`);
  assert.ok(
    box.x >= 0 && box.y >= 0 && box.x + box.width <= viewport.width && box.y + box.height <= viewport.height,
    `${testid} inside the ${viewport.width}×${viewport.height} window: ${JSON.stringify(box)}`,
  );
  return box;
}

test('with Settings and Models both open at 1280×800 the conversation keeps its width and height', async () => {
  const viewport = { width: 1280, height: 800 };
  await withPage('settings-panels-1280', viewport, async (page) => {
    await newChat(page, { maxTokens: '8' });
    await setSampling(page);
    await send(page, FRANCE);
    await waitFinish(page);
    await screenshot(page, 'settings-1280');
    await page.getByTestId('models-toggle').click();
    await page.locator('[data-testid=chat-side] [data-testid=model-row]').first().waitFor();
    assert.equal(await page.locator('[data-testid=chat-side] [data-testid=settings-panel]').count(), 1);
    const conv = await page.getByTestId('messages').boundingBox();
    assert.ok(conv.width >= 600, `the conversation is ${conv.width}px wide`);
    assert.ok(conv.height >= 400, `the conversation is ${conv.height}px tall`);
    // Beside it, not over it: the reply and the composer stay whole.
    const side = await page.getByTestId('chat-side').boundingBox();
    assert.ok(side.x >= conv.x + conv.width, 'the panels sit beside the conversation');
    const reply = await lastReply(page).boundingBox();
    assert.ok(reply.x + reply.width <= side.x, 'the reply is not under the panels');
    await onScreen(page, 'composer-input', viewport);
    await onScreen(page, 'send-button', viewport);
    await screenshot(page, 'settings-models-1280');
    // Every setting and the model actions are reachable in the column.
    await onScreen(page, 'setting-seed', viewport);
    await onScreen(page, 'server-settings-link', viewport);
    await onScreen(page, 'model-unload', viewport);
    await onScreen(page, 'pull-button', viewport);
  });
});

test('at 420×800 the settings and each model\'s state and Unload button are on screen', async () => {
  const viewport = { width: 420, height: 800 };
  await withPage('settings-420', viewport, async (page) => {
    await newChat(page);
    await setSampling(page, { temperature: '' });
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth), 'no sideways scrolling');
    // The model picker keeps a row of its own, wide enough to read the model's name.
    const picker = await page.getByTestId('model-picker').boundingBox();
    assert.ok(picker.width >= 300, `the model picker is ${picker.width}px wide at 420`);
    for (const f of FIELDS) {
      await onScreen(page, f.id, viewport);
      await onScreen(page, `${f.id}-default`, viewport);
    }
    await page.getByTestId('setting-temperature').scrollIntoViewIfNeeded();
    await screenshot(page, 'settings-420');
    await onScreen(page, 'composer-input', viewport);

    await page.getByTestId('settings-toggle').click();
    await page.getByTestId('models-toggle').click();
    const row = page.locator(`[data-testid=model-row][data-id="${model}"]`);
    await row.waitFor();
    // The table does not run past its box: nothing to scroll sideways to.
    const overflow = await page.locator('.models-panel .table-wrap').evaluate((w) => w.scrollWidth - w.clientWidth);
    assert.equal(overflow, 0, 'the models list fits its box');
    await onScreen(page, 'model-state', viewport);
    assert.equal(await row.getByTestId('model-state').innerText(), 'loaded');
    await onScreen(page, 'model-unload', viewport);
    await screenshot(page, 'models-420');
    // And it works from there: unload, then load it again.
    await row.getByTestId('model-unload').click();
    await row.locator('[data-testid=model-state]', { hasText: 'not loaded' }).waitFor();
    await onScreen(page, 'model-load', viewport);
    await row.getByTestId('model-load').click();
    await row.locator('[data-testid=model-state]', { hasText: /^loaded$/ }).waitFor();
  });
  // The server's own settings have a page: the Ollama switch and the prompt cache on screen at once.
  await withPage('server-420', { ...viewport, path: '/server' }, async (page) => {
    await page.getByTestId('setting-ollama-port').waitFor();
    await onScreen(page, 'setting-ollama-port', viewport);
    await onScreen(page, 'prompt-cache-clear', viewport);
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth), 'no sideways scrolling');
  });
});

test('a prefix kept on disk outlives a restart: the reply says how much came from disk, Settings shows the files and clears them', async () => {
  const dir = mkdtempSync(join(process.env.SHOAL_UI_TMP || '/tmp', 'prompt-cache-'));
  const db = join(dir, 'store.sqlite');
  // An agent's instructions stand-in: above the disk tier's 256-token floor.
  const system = Array.from({ length: 24 }, (_, i) => `Rule ${i + 1}: answer briefly, in plain words, and only what is asked.`).join(' ');
  const chatOnce = async (srv) => {
    let stats;
    await usePage(await openPage(browser, { base: srv.url }), 'prompt-cache', async (page) => {
      await newChat(page, { system });
      await send(page, FRANCE);
      await waitFinish(page);
      stats = lastReply(page).getByTestId('usage-cached');
      stats = { value: Number(await stats.getAttribute('data-value')), text: await stats.innerText() };
    }, { shot: false });
    return stats;
  };
  let first = await startServer(['--db', db], { prefixCacheMb: 64 });
  try {
    const cold = await chatOnce(first);
    assert.equal(cold.value, 0, 'a cold prompt');
    assert.doesNotMatch(cold.text, /from disk/);
  } finally {
    // The file is written after the reply; a graceful stop lands it before exit.
    assert.equal(await stopServer(first.proc), 0, 'a graceful exit');
  }
  const second = await startServer(['--db', db], { prefixCacheMb: 64 });
  try {
    const warm = await chatOnce(second);
    assert.ok(warm.value > 256, `cached ${warm.value}`);
    assert.match(warm.text, new RegExp(`^cached ${warm.value} \\(${warm.value} from disk\\)$`));
    await usePage(await openPage(browser, { base: second.url, path: '/server' }), 'prompt-cache-settings', async (page) => {
      const size = page.getByTestId('prompt-cache-size');
      await page.waitForFunction(() => /on disk in \d+ entr/.test(document.querySelector('[data-testid=prompt-cache-size]')?.textContent ?? ''));
      assert.match(await size.innerText(), /on disk in 1 entry \(of 10\.0 GiB\)/);
      assert.ok(Number(await size.getAttribute('data-disk-bytes')) > 0);
      await page.getByTestId('prompt-cache-clear').click();
      await page.getByTestId('prompt-cache-note').waitFor();
      assert.match(await page.getByTestId('prompt-cache-note').innerText(), /^Removed 1 from disk/);
      await page.waitForFunction(() => document.querySelector('[data-testid=prompt-cache-size]')?.dataset.diskBytes === '0');
      assert.match(await size.innerText(), /0\.0 KiB on disk in 0 entries|0 B on disk in 0 entries/);
    }, { shot: false });
    const cache = await api('/v1/cache', undefined, 'GET', { base: second.url });
    assert.equal(cache.json.disk.entries, 0);
  } finally {
    await killServer(second.proc);
  }
});
