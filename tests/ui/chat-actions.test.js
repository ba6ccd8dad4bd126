// What every chat app has, on the real model: copy a message or a code block,
// highlighted code, edit a sent message and regenerate a reply (each keeping the
// older versions, ‹ 1/2 ›), continue a reply cut by its token limit as one reply
// (each step with its own exact usage), export a chat as Markdown and as JSON
// with each reply's usage and finish reason, and titles the model writes.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, test } from 'node:test';
import {
  api,
  currentServerId,
  lastReply,
  launch,
  ledgerEntry,
  newChat,
  openPage,
  screenshot,
  send,
  shownStats,
  storedConversation,
  streamChat,
  usageFigures,
  usePage,
  waitFinish,
} from './helpers.js';

const FRANCE = 'What is the capital of France? Answer in one sentence.';
const COUNT = 'Count from 1 to 40, separated by commas.';

let browser;
let model;

before(async () => {
  const models = await api('/v1/models');
  assert.equal(models.status, 200, models.text);
  model = models.json.data.find((m) => m.shoal?.source?.kind === 'path')?.id ?? models.json.data[0].id;
  browser = await launch();
});

after(async () => {
  await browser?.close();
});

const clipboard = (page) => page.evaluate(() => navigator.clipboard.readText());

/** A stored message's text. */
const textOf = (m) => m.pieces.map((p) => p.text ?? '').join('');

/** The replies' response ids, in order. */
const responseIds = (page) =>
  page.getByTestId('message-assistant').evaluateAll((rs) => rs.map((r) => r.dataset.responseId));

test('code blocks are highlighted, and a message or a code block is copied as written', async () => {
  const code = 'def add(a, b):\n    # the sum\n    return a + b';
  const content = `Here is a function:\n\n\`\`\`python\n${code}\n\`\`\`\n\nand some \`inline\` code.`;
  const conv = await api('/v1/conversations', {
    title: 'copy and highlight',
    settings: { model: '', systemPrompt: '', temperature: 0, maxTokens: null, stop: [], reasoning: false },
  });
  assert.equal(conv.status, 200, conv.text);
  const id = conv.json.id;
  assert.equal((await api(`/v1/conversations/${id}/messages`, { role: 'user', content: 'show code' })).status, 200);
  const reply = await api(`/v1/conversations/${id}/messages`, { role: 'assistant', content, metadata: { client_finish: 'stop' } });
  assert.equal(reply.status, 200, reply.text);
  for (const width of [420, 1280]) {
    await usePage(await openPage(browser, { path: `/chat/${id}`, width }), `chat-copy-block-${width}`, async (page) => {
      const md = lastReply(page).getByTestId('assistant-content');
      await md.locator('pre code').waitFor();
      // The code block's Copy button covers none of the code.
      const [button, pre] = [await md.getByTestId('copy-code').boundingBox(), await md.locator('pre').boundingBox()];
      assert.ok(button.y + button.height <= pre.y + 0.5, `the button (${JSON.stringify(button)}) is over the code (${JSON.stringify(pre)})`);
    });
  }
  await usePage(await openPage(browser, { path: `/chat/${id}` }), 'chat-copy-highlight', async (page) => {
    const md = lastReply(page).getByTestId('assistant-content');
    await md.locator('pre code').waitFor();
    // highlight.js marked the keywords, the comment and the built-in by their token classes.
    const tokens = await md.locator('pre code span').evaluateAll((ss) => ss.map((s) => [s.className, s.textContent]));
    assert.ok(tokens.some(([c, t]) => c.includes('hljs-keyword') && t === 'def'), JSON.stringify(tokens));
    assert.ok(tokens.some(([c, t]) => c.includes('hljs-comment') && t === '# the sum'), JSON.stringify(tokens));
    const colours = await md.locator('pre code .hljs-keyword').first().evaluate((s) => getComputedStyle(s).color);
    const plain = await md.locator('pre code').evaluate((c) => getComputedStyle(c).color);
    assert.notEqual(colours, plain, 'keywords are coloured');
    // The code block's own Copy button copies the code alone.
    await md.getByTestId('copy-code').click();
    await md.locator('[data-testid=copy-code][data-copied=copied]').waitFor();
    assert.equal(await clipboard(page), code);
    // A reply's Copy copies its Markdown source; a user message's, its text.
    await lastReply(page).getByTestId('copy-message').click();
    assert.equal(await clipboard(page), content);
    await page.getByTestId('message-user').getByTestId('copy-message').click();
    assert.equal(await clipboard(page), 'show code');
  });
});

/** The shown version of a reply ("2/3"), or null when it has one. */
const versionLabel = async (reply) =>
  (await reply.getByTestId('version-label').count()) ? reply.getByTestId('version-label').innerText() : null;

test('an edited message is sent again; its reply keeps the old answer as an earlier version', async () => {
  await usePage(await openPage(browser), 'chat-edit', async (page) => {
    await newChat(page);
    await send(page, 'Name a colour.');
    await waitFinish(page);
    const before = (await responseIds(page))[0];
    const oldText = await lastReply(page).getByTestId('assistant-content').innerText();
    await page.getByTestId('message-user').getByTestId('edit-message').click();
    await page.getByTestId('edit-input').fill('The capital');
    // As in the composer: Shift+Enter adds a line, Enter sends.
    await page.getByTestId('edit-input').press('Shift+Enter');
    assert.equal(await page.getByTestId('edit-input').inputValue(), 'The capital\n');
    await page.getByTestId('edit-input').fill(FRANCE);
    const req = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions') && r.method() === 'POST');
    await page.getByTestId('edit-input').press('Enter');
    const body = JSON.parse((await req).postData());
    assert.deepEqual(body.messages, [{ role: 'user', content: FRANCE }], 'the old exchange is not sent');
    assert.equal(await waitFinish(page), 'stop');
    assert.deepEqual(await page.getByTestId('user-content').allInnerTexts(), [FRANCE]);
    // The title came from the first message's words, so it follows their edit.
    const title = page.locator('[data-testid=conversation-item].active [data-testid=conversation-title]');
    assert.ok(FRANCE.startsWith(await title.innerText()), await title.innerText());
    const reply = lastReply(page);
    assert.match(await reply.getByTestId('assistant-content').innerText(), /Paris/);
    assert.equal(await page.getByTestId('message-assistant').count(), 1, 'one reply, in two versions');
    assert.equal(await versionLabel(reply), '2/2');
    assert.equal(await reply.getByTestId('answered').count(), 0);
    const [now] = await responseIds(page);
    assert.notEqual(now, before);

    // The first version is one click away, saying which words it answered.
    await reply.getByTestId('version-prev').click();
    assert.equal(await versionLabel(reply), '1/2');
    assert.equal(await reply.getByTestId('assistant-content').innerText(), oldText);
    assert.match(await reply.getByTestId('answered').innerText(), /Name a colour\./);
    assert.deepEqual(await responseIds(page), [before]);
    const shown = await shownStats(reply);
    assert.deepEqual(
      { prompt: shown.prompt, completion: shown.completion, total: shown.total },
      (({ prompt, completion, total }) => ({ prompt, completion, total }))(usageFigures((await ledgerEntry(before)).usage)),
    );
    await reply.getByTestId('version-next').click();
    assert.equal(await versionLabel(reply), '2/2');

    // The store holds the edited question and both versions of its reply.
    const stored = await storedConversation(await currentServerId(page));
    assert.deepEqual(stored.messages.map((m) => m.role), ['user', 'assistant']);
    assert.equal(textOf(stored.messages[0]), FRANCE);
    const cid = await currentServerId(page);
    await page.waitForFunction(async ([c, t]) => (await (await fetch('/v1/conversations/' + c)).json()).title === t, [cid, FRANCE]);
    const pieces = stored.messages[1].pieces;
    assert.deepEqual(
      pieces.map((p) => [p.version ?? 0, p.metadata.response_id, p.metadata.answered ?? null]),
      [[0, before, 'Name a colour.'], [1, now, null]],
    );
  });
});

test('regenerate keeps the reply it replaces as an earlier version, each with its own usage', async () => {
  let id;
  let ids;
  await usePage(await openPage(browser), 'chat-regenerate', async (page) => {
    await newChat(page);
    await send(page, FRANCE);
    assert.equal(await waitFinish(page), 'stop');
    const [first] = await responseIds(page);
    const text = await lastReply(page).getByTestId('assistant-content').innerText();
    const req = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions') && r.method() === 'POST');
    await lastReply(page).getByTestId('regenerate').click();
    assert.deepEqual(JSON.parse((await req).postData()).messages, [{ role: 'user', content: FRANCE }]);
    await page.waitForFunction(
      (old) => {
        const r = [...document.querySelectorAll('[data-testid=message-assistant]')];
        return r.length === 1 && r[0].dataset.responseId && r[0].dataset.responseId !== old;
      },
      first,
    );
    assert.equal(await waitFinish(page), 'stop');
    const reply = lastReply(page);
    // Greedy: the same words, from a new request with usage of its own.
    assert.equal(await reply.getByTestId('assistant-content').innerText(), text);
    assert.equal(await versionLabel(reply), '2/2');
    const [second] = await responseIds(page);
    ids = [first, second];
    for (const [i, rid] of ids.entries()) {
      if (i === 0) await reply.getByTestId('version-prev').click();
      else await reply.getByTestId('version-next').click();
      assert.deepEqual(await responseIds(page), [rid]);
      const shown = await shownStats(reply);
      assert.deepEqual(
        { prompt: shown.prompt, cached: shown.cached, completion: shown.completion, reasoning: shown.reasoning, total: shown.total },
        usageFigures((await ledgerEntry(rid)).usage),
      );
    }
    id = await currentServerId(page);
    const stored = await storedConversation(id);
    assert.equal(stored.messages.length, 2);
    assert.deepEqual(stored.messages[1].pieces.map((p) => [p.version ?? 0, p.metadata.response_id]), [[0, first], [1, second]]);
  });
  // Reloaded, the newest version shows and the older one is still there.
  await usePage(await openPage(browser, { width: 420, path: `/chat/${id}` }), 'chat-regenerate-420', async (page) => {
    const reply = page.getByTestId('message-assistant');
    await reply.getByTestId('version-label').waitFor();
    assert.equal(await versionLabel(reply), '2/2');
    assert.deepEqual(await responseIds(page), [ids[1]]);
    await reply.getByTestId('version-prev').click();
    assert.deepEqual(await responseIds(page), [ids[0]]);
    await screenshot(page, 'chat-versions-420');
  });
});

test('continue carries on a reply cut by its limit as one reply, each step with its own usage, and the chat exports with them', async () => {
  // The reply of both limits together, in one request.
  const whole = await streamChat({
    model,
    messages: [{ role: 'user', content: COUNT }],
    temperature: 0,
    max_tokens: 16,
    stream: true,
    stream_options: { include_usage: true },
  });
  let id;
  await usePage(await openPage(browser), 'chat-continue', async (page) => {
    await newChat(page, { maxTokens: '8' });
    await send(page, COUNT);
    assert.equal(await waitFinish(page), 'length');
    const firstText = await lastReply(page).getByTestId('assistant-content').innerText();
    const req = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions') && r.method() === 'POST');
    await lastReply(page).getByTestId('continue').click();
    const body = JSON.parse((await req).postData());
    assert.deepEqual(
      body.messages.map((m) => m.role),
      ['user', 'assistant'],
      'the reply so far goes back as the assistant turn it continues',
    );
    assert.equal(await waitFinish(page), 'length');
    // One reply: the steps' text appended, Continue offered again, copy takes it whole.
    assert.equal(await page.getByTestId('message-assistant').count(), 1);
    const reply = lastReply(page);
    await reply.getByTestId('continue').waitFor();
    const steps = reply.getByTestId('reply-step');
    assert.equal(await steps.count(), 2);
    assert.match(await reply.getByTestId('reply-steps').locator('summary').innerText(), /2 steps · 16 tokens in all/);
    // Each step's figures are its own request's, as the ledger recorded them; the
    // second's prompt is the first's prompt and reply.
    const ids = await steps.evaluateAll((li) => li.map((x) => x.dataset.responseId));
    const figures = [];
    for (const [i, rid] of ids.entries()) {
      const u = usageFigures((await ledgerEntry(rid)).usage);
      figures.push(u);
      const [prompt, completion, finish] = await steps
        .nth(i)
        .evaluate((x) => [Number(x.dataset.prompt), Number(x.dataset.completion), x.dataset.finish]);
      assert.deepEqual([prompt, completion, finish], [u.prompt, u.completion, 'length']);
      assert.equal(completion, 8);
    }
    assert.equal(figures[1].prompt, figures[0].prompt + figures[0].completion);
    // The reply's own line is its last step's.
    assert.deepEqual(await responseIds(page), [ids[1]]);
    assert.equal((await shownStats(reply)).completion, 8);
    id = await currentServerId(page);
    const stored = await storedConversation(id);
    assert.equal(stored.messages.length, 2);
    const pieces = stored.messages[1].pieces;
    assert.deepEqual(pieces.map((p) => [p.step ?? 0, p.metadata.response_id]), [[0, ids[0]], [1, ids[1]]]);
    const texts = pieces.map((p) => p.text);
    assert.equal(body.messages[1].content, texts[0]);
    assert.equal(texts[0], firstText);
    assert.equal(texts.join(''), whole.content);
    await reply.getByTestId('copy-message').click();
    assert.equal(await clipboard(page), whole.content);

    // Export: JSON with each step's usage and finish, Markdown to read.
    await page.getByTestId('export-menu').locator('summary').click();
    const [json] = await Promise.all([page.waitForEvent('download'), page.getByTestId('export-json').click()]);
    assert.match(json.suggestedFilename(), /^Count-from-1-to-40.*\.json$/);
    const doc = JSON.parse(readFileSync(await json.path(), 'utf8'));
    assert.equal(doc.id, id);
    assert.deepEqual(
      doc.messages.map((m) => [m.role, m.finish_reason ?? null, m.steps?.length ?? null]),
      [['user', null, null], ['assistant', 'length', 2]],
    );
    const exported = doc.messages[1];
    assert.equal(exported.content, whole.content);
    for (const [i, st] of exported.steps.entries()) {
      assert.equal(st.response_id, ids[i]);
      assert.equal(st.content, texts[i]);
      const u = figures[i];
      assert.deepEqual(
        [st.usage.prompt_tokens, st.usage.cached_tokens, st.usage.completion_tokens, st.usage.reasoning_tokens, st.usage.total_tokens],
        [u.prompt, u.cached, u.completion, u.reasoning, u.total],
      );
    }
    // The reply's usage is every token its two requests used.
    assert.equal(exported.usage.completion_tokens, 16);
    assert.equal(exported.usage.prompt_tokens, figures[0].prompt + figures[1].prompt);
    await page.getByTestId('export-menu').locator('summary').click();
    const [md] = await Promise.all([page.waitForEvent('download'), page.getByTestId('export-markdown').click()]);
    assert.match(md.suggestedFilename(), /\.md$/);
    const text = readFileSync(await md.path(), 'utf8');
    assert.ok(text.startsWith(`# ${COUNT}`), text);
    assert.ok(!text.includes('(continued)'), text);
    assert.ok(text.includes(whole.content), 'the reply reads as one text');
    assert.equal(text.match(/finish: length/g)?.length, 2, text);
    assert.ok(text.includes('step 2 of 2'), text);
    assert.ok(text.includes(`completion ${figures[1].completion} tokens`), text);
  });
  // One reply with its steps after a reload, in a narrow window too.
  await usePage(await openPage(browser, { width: 420, path: `/chat/${id}` }), 'chat-continue-420', async (page) => {
    const reply = page.getByTestId('message-assistant');
    await reply.getByTestId('reply-steps').waitFor();
    assert.equal(await reply.count(), 1);
    assert.equal(await reply.getByTestId('reply-step').count(), 2);
    await reply.getByTestId('continue').waitFor();
    await reply.getByTestId('reply-steps').locator('summary').click();
    await screenshot(page, 'chat-actions-420');
  });
});

test('the model writes a chat’s title after its first reply, as a request of the ledger’s; a rename meanwhile wins', async () => {
  let id;
  let titleBy;
  await usePage(await openPage(browser, { modelTitles: true }), 'chat-model-title', async (page) => {
    await newChat(page);
    const asked = page.waitForRequest(
      (r) => r.url().endsWith('/v1/chat/completions') && r.method() === 'POST' && !JSON.parse(r.postData()).stream,
    );
    await send(page, FRANCE);
    assert.equal(await waitFinish(page), 'stop');
    // The ask follows the first exchange, so the reply's prefix is reused.
    const body = JSON.parse((await asked).postData());
    const reply = await lastReply(page).getByTestId('assistant-content').innerText();
    assert.deepEqual(body.messages.slice(0, 1), [{ role: 'user', content: FRANCE }]);
    assert.equal(body.messages[1].role, 'assistant');
    assert.equal(body.messages[1].content.trim(), reply.trim());
    assert.equal(body.messages[2].role, 'user');
    assert.equal(body.temperature, 0);
    const item = page.locator('[data-testid=conversation-item].active [data-testid=conversation-title]');
    await page.waitForFunction(
      () => document.querySelector('[data-testid=conversation-item].active [data-testid=conversation-title]')?.dataset.titledBy,
    );
    const rid = await item.getAttribute('data-titled-by');
    const title = await item.innerText();
    assert.ok(title.length > 0 && title.length <= 60, title);
    assert.ok(!/^["'“]|[.]$/.test(title), `cleaned: ${title}`);
    // Its cost is the ledger's, as any request's.
    const entry = await ledgerEntry(rid);
    assert.ok(entry.usage.completion_tokens > 0 && entry.usage.completion_tokens <= 16, JSON.stringify(entry.usage));
    assert.match(await item.getAttribute('title'), new RegExp(`${entry.usage.total_tokens} tokens \\(${entry.usage.completion_tokens} written\\)`));
    id = await currentServerId(page);
    await page.waitForFunction(
      async ([cid, t]) => {
        const r = await fetch('/v1/conversations/' + cid);
        const c = await r.json();
        return c.title === t && c.settings?.titleBy?.responseId;
      },
      [id, title],
    );
    const stored = await storedConversation(id);
    titleBy = stored.settings.titleBy;
    assert.equal(titleBy.responseId, rid);
    assert.equal(titleBy.completionTokens, entry.usage.completion_tokens);
    assert.equal(titleBy.promptTokens, entry.usage.prompt_tokens);

    // A rename while the model writes the title wins: the title request is held until then.
    let release;
    const held = new Promise((r) => (release = r));
    await page.route('**/v1/chat/completions', async (route) => {
      if (JSON.parse(route.request().postData()).stream) return route.continue();
      await held;
      return route.continue();
    });
    await newChat(page);
    const second = page.waitForRequest(
      (r) => r.url().endsWith('/v1/chat/completions') && r.method() === 'POST' && !JSON.parse(r.postData()).stream,
    );
    await send(page, 'Name a colour.');
    await waitFinish(page);
    await second;
    const active = page.locator('[data-testid=conversation-item].active');
    await active.getByTestId('rename-conversation').click();
    await page.getByTestId('rename-input').fill('My colours');
    await page.getByTestId('rename-input').press('Enter');
    const answered = page.waitForResponse((r) => r.url().endsWith('/v1/chat/completions') && r.request().method() === 'POST');
    release();
    await answered;
    const cid = await currentServerId(page);
    await page.waitForFunction(async (c) => (await (await fetch('/v1/conversations/' + c)).json()).title === 'My colours', cid);
    assert.equal(await active.getByTestId('conversation-title').innerText(), 'My colours');
    assert.equal(await active.getByTestId('conversation-title').getAttribute('data-titled-by'), '');
    assert.equal((await storedConversation(cid)).settings.titleBy, undefined);

    // Off: no title request at all.
    if ((await page.getByTestId('settings-panel').count()) === 0) await page.getByTestId('settings-toggle').click();
    await page.getByTestId('setting-model-titles').uncheck();
    let asks = 0;
    page.on('request', (r) => {
      if (r.url().endsWith('/v1/chat/completions') && r.method() === 'POST' && !JSON.parse(r.postData()).stream) asks++;
    });
    await newChat(page);
    await send(page, 'Name a fruit.');
    await waitFinish(page);
    const third = await currentServerId(page);
    assert.equal((await storedConversation(third)).title, 'Name a fruit.');
    assert.equal(asks, 0);
  });
  // Reloaded, the model's title and its cost are still there.
  await usePage(await openPage(browser, { path: `/chat/${id}` }), 'chat-model-title-reload', async (page) => {
    const item = page.locator('[data-testid=conversation-item].active [data-testid=conversation-title]');
    await page.waitForFunction(
      (rid) => document.querySelector('[data-testid=conversation-item].active [data-testid=conversation-title]')?.dataset.titledBy === rid,
      titleBy.responseId,
    );
    assert.match(await item.getAttribute('title'), /Title written by/);
  }, { shot: false });
});
