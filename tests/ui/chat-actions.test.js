// What every chat app has, on the real model: copy a message or a code block,
// highlighted code, edit a sent message, regenerate a reply, continue a reply
// cut by its token limit (each step with its own exact usage), and export a
// chat as Markdown and as JSON with each reply's usage and finish reason.
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

test('an edited message is sent again in place of the old one and what followed it', async () => {
  await usePage(await openPage(browser), 'chat-edit', async (page) => {
    await newChat(page);
    await send(page, 'Name a colour.');
    await waitFinish(page);
    const before = (await responseIds(page))[0];
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
    assert.match(await lastReply(page).getByTestId('assistant-content').innerText(), /Paris/);
    const ids = await responseIds(page);
    assert.equal(ids.length, 1);
    assert.notEqual(ids[0], before);
    // The store holds the edited exchange only.
    const stored = await storedConversation(await currentServerId(page));
    assert.deepEqual(
      stored.messages.map((m) => [m.role, textOf(m).includes('Paris') || textOf(m) === FRANCE]),
      [['user', true], ['assistant', true]],
    );
  });
});

test('regenerate replaces the last reply with a new one to the same message', async () => {
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
    // Greedy: the same words, from a new request with usage of its own.
    assert.equal(await lastReply(page).getByTestId('assistant-content').innerText(), text);
    const [second] = await responseIds(page);
    const entry = await ledgerEntry(second);
    const shown = await shownStats(lastReply(page));
    assert.deepEqual(
      { prompt: shown.prompt, cached: shown.cached, completion: shown.completion, reasoning: shown.reasoning, total: shown.total },
      usageFigures(entry.usage),
    );
    assert.equal((await storedConversation(await currentServerId(page))).messages.length, 2);
  });
});

test('continue carries on a reply cut by its limit, each step with its own usage, and the chat exports with them', async () => {
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
    const req = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions') && r.method() === 'POST');
    await lastReply(page).getByTestId('continue').click();
    const body = JSON.parse((await req).postData());
    assert.deepEqual(
      body.messages.map((m) => m.role),
      ['user', 'assistant'],
      'the reply so far goes back as the assistant turn it continues',
    );
    await page.waitForFunction(() => document.querySelectorAll('[data-testid=message-assistant]').length === 2);
    assert.equal(await waitFinish(page), 'length');
    const steps = page.getByTestId('message-assistant');
    assert.deepEqual(
      await steps.evaluateAll((rs) => rs.map((r) => r.dataset.continues)),
      ['false', 'true'],
    );
    assert.equal(await steps.nth(0).getByTestId('continue').count(), 0, 'only the last step offers Continue');
    assert.equal(await steps.nth(1).getByTestId('continued').count(), 1);
    // Each step's figures are its own request's, as the ledger recorded them; the
    // second's prompt is the first's prompt and reply.
    const ids = await responseIds(page);
    const shown = [];
    for (const [i, rid] of ids.entries()) {
      const s = await shownStats(steps.nth(i));
      shown.push(s);
      assert.deepEqual(
        { prompt: s.prompt, cached: s.cached, completion: s.completion, reasoning: s.reasoning, total: s.total },
        usageFigures((await ledgerEntry(rid)).usage),
      );
      assert.equal(s.completion, 8);
    }
    assert.equal(shown[1].prompt, shown[0].prompt + shown[0].completion);
    // The two steps read as the one reply of 16 tokens.
    id = await currentServerId(page);
    const stored = await storedConversation(id);
    const texts = stored.messages.filter((m) => m.role === 'assistant').map(textOf);
    assert.equal(body.messages[1].content, texts[0]);
    assert.equal(texts.join(''), whole.content);

    // Export: JSON with each step's usage and finish, Markdown to read.
    await page.getByTestId('export-menu').locator('summary').click();
    const [json] = await Promise.all([page.waitForEvent('download'), page.getByTestId('export-json').click()]);
    assert.match(json.suggestedFilename(), /^Count-from-1-to-40.*\.json$/);
    const doc = JSON.parse(readFileSync(await json.path(), 'utf8'));
    assert.equal(doc.id, id);
    assert.deepEqual(
      doc.messages.map((m) => [m.role, m.finish_reason ?? null, m.continues_previous ?? null]),
      [['user', null, null], ['assistant', 'length', false], ['assistant', 'length', true]],
    );
    for (const [i, m] of doc.messages.slice(1).entries()) {
      assert.equal(m.response_id, ids[i]);
      assert.equal(m.content, texts[i]);
      const u = usageFigures((await ledgerEntry(ids[i])).usage);
      assert.deepEqual(
        [m.usage.prompt_tokens, m.usage.cached_tokens, m.usage.completion_tokens, m.usage.reasoning_tokens, m.usage.total_tokens],
        [u.prompt, u.cached, u.completion, u.reasoning, u.total],
      );
    }
    await page.getByTestId('export-menu').locator('summary').click();
    const [md] = await Promise.all([page.waitForEvent('download'), page.getByTestId('export-markdown').click()]);
    assert.match(md.suggestedFilename(), /\.md$/);
    const text = readFileSync(await md.path(), 'utf8');
    assert.ok(text.startsWith(`# ${COUNT}`), text);
    assert.ok(text.includes('**Assistant** (continued)'), text);
    assert.ok(texts.every((t) => text.includes(t)), text);
    assert.equal(text.match(/finish: length/g)?.length, 2, text);
    assert.ok(text.includes(`completion ${shown[1].completion} tokens`), text);
  });
  // The steps stay apart after a reload, in a narrow window too.
  await usePage(await openPage(browser, { width: 420, path: `/chat/${id}` }), 'chat-continue-420', async (page) => {
    await page.waitForFunction(() => document.querySelectorAll('[data-testid=message-assistant]').length === 2);
    assert.deepEqual(
      await page.getByTestId('message-assistant').evaluateAll((rs) => rs.map((r) => r.dataset.continues)),
      ['false', 'true'],
    );
    await page.getByTestId('message-assistant').nth(1).getByTestId('continue').waitFor();
    await screenshot(page, 'chat-actions-420');
  });
});
