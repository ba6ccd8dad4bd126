// Tools from MCP servers in the chat, on the real model and the reference MCP server
// from npm (tests/mcp): the Server page edits mcp.json and lists the servers; a call
// waits for Allow, runs, and its result goes back to the model, whose next turn is a
// step of the same reply with its own ledger row; Deny; read-only tools allowed
// ahead; "Always allow" kept by the server; a server that dies mid-call and one that
// hangs; Streamable HTTP; the filesystem server on a temporary folder; the step limit. The small model is made to
// call a tool with the chat's "must call a tool" switch (tool_choice: required), and
// each server's `enabledTools` offers one tool, so every run calls the same one.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { api, currentServerId, lastReply, launch, ledgerEntry, newChat, openPage, screenshot, send, storedConversation, usePage } from './helpers.js';

const MCP_DIR = process.env.SHOAL_UI_MCP_DIR;
const EVERYTHING = MCP_DIR && join(MCP_DIR, 'node_modules/@modelcontextprotocol/server-everything/dist/index.js');
const FRAGILE = MCP_DIR && join(MCP_DIR, 'fragile.mjs');
const FILESYSTEM = MCP_DIR && join(MCP_DIR, 'node_modules/@modelcontextprotocol/server-filesystem/dist/index.js');
/** The suite's server stops a tool call after this long (run-ui.sh: --mcp-timeout-secs). */
const CALL_TIMEOUT_SECS = 20;
const ASK = 'Echo the word hello.';

let browser;

/** mcp.json with the reference server (only `echo` offered) and the fragile one (only `crash`). */
const FILE = () => ({
  mcpServers: {
    every: { command: 'node', args: [EVERYTHING, 'stdio'], enabledTools: ['echo'] },
    fragile: { command: 'node', args: [FRAGILE], enabledTools: ['crash'], disabled: true },
  },
});

before(async () => {
  assert.ok(MCP_DIR, 'SHOAL_UI_MCP_DIR is not set: run the suite through tests/run-ui.sh');
  browser = await launch();
});

after(async () => {
  await api('/v1/mcp/config', { mcpServers: {} }, 'PUT');
  await browser?.close();
});

/** Puts mcp.json on the server (the Server page test does it through the page). */
async function configure(file) {
  const r = await api('/v1/mcp/config', file, 'PUT');
  assert.equal(r.status, 200, r.text);
}

/** A new chat with tools on, the model made to call one, and at most `steps` model turns. */
async function toolChat(page, { steps = 2, autoReadOnly = false } = {}) {
  await newChat(page, { maxTokens: '48' });
  await page.getByTestId('setting-tools').setChecked(true);
  await page.getByTestId('setting-tool-required').setChecked(true);
  await page.getByTestId('setting-auto-read-only').setChecked(autoReadOnly);
  await page.getByTestId('setting-tool-steps').fill(String(steps));
}

/** Every chat request the page sends, in order. */
function chatRequests(page) {
  const sent = [];
  page.on('request', (r) => {
    if (r.url().endsWith('/v1/chat/completions') && r.method() === 'POST') sent.push(JSON.parse(r.postData()));
  });
  return sent;
}

/** Waits until the reply's tool loop has ended (the Stop button gone). */
async function loopEnded(page) {
  await page.getByTestId('stop-button').waitFor({ state: 'detached', timeout: 180_000 });
}

test('the Server page edits mcp.json and lists each server with its state', async () => {
  for (const width of [1280, 420]) {
    await configure({ mcpServers: {} });
    await usePage(await openPage(browser, { path: '/server', width }), `mcp-server-page-${width}`, async (page) => {
      await page.getByTestId('mcp-none').waitFor();
      const box = page.getByTestId('mcp-config');
      // Not JSON: said so, and nothing changes.
      await box.fill('{"mcpServers": {');
      await page.getByTestId('mcp-save').click();
      assert.match(await page.getByTestId('mcp-config-error').innerText(), /Not valid JSON/);
      // A server with neither a command nor a URL: the server's own 400, naming it.
      await box.fill(JSON.stringify({ mcpServers: { broken: {} } }));
      await page.getByTestId('mcp-save').click();
      assert.match(await page.getByTestId('mcp-config-error').innerText(), /'broken'.*command/);
      await box.fill(JSON.stringify(FILE(), null, 2));
      await page.getByTestId('mcp-save').click();
      await page.getByTestId('mcp-saved').waitFor();
      const every = page.locator('[data-testid=mcp-server][data-name=every]');
      await every.waitFor();
      assert.equal(await every.getAttribute('data-state'), 'ready');
      assert.match(await every.innerText(), /1 tools/);
      assert.equal(await page.locator('[data-testid=mcp-server][data-name=fragile]').getAttribute('data-state'), 'disabled');
      // Nothing sideways at either width.
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
      assert.ok(overflow <= 0, `the page scrolls sideways by ${overflow}px at ${width}`);
    });
  }
  const stored = await api('/v1/mcp/config');
  assert.deepEqual(stored.json.mcpServers.every.enabledTools, ['echo']);
});

test('a tool call waits for Allow, runs, and the model reads its result in the next step', async () => {
  await configure(FILE());
  await usePage(await openPage(browser), 'mcp-allow', async (page) => {
    const sent = chatRequests(page);
    await toolChat(page, { steps: 2 });
    await send(page, ASK);
    const use = lastReply(page).getByTestId('tool-use').first();
    await page.locator('[data-testid=tool-use][data-state=asking]').waitFor({ timeout: 120_000 });
    assert.equal(await use.getAttribute('data-tool'), 'every__echo');
    const args = JSON.parse(await use.getByTestId('tool-args').innerText());
    assert.equal(typeof args.message, 'string');
    await screenshot(page, 'mcp-asking');
    await use.getByTestId('tool-allow').click();
    await loopEnded(page);
    const reply = lastReply(page);
    // The call ran; its result is folded under the call, with the tool's own time.
    assert.equal(await use.getAttribute('data-state'), 'done');
    assert.equal(await use.getByTestId('tool-result-text').textContent(), `Echo: ${args.message}`);
    assert.match(await use.getByTestId('tool-took').innerText(), /^\d+\.\d\d s$/);
    // The model was made to call again in its second turn: the limit of 2 ended the loop there.
    await reply.getByTestId('tool-limit').waitFor();
    assert.equal(await reply.locator('[data-testid=tool-use]').nth(1).getAttribute('data-state'), 'skipped');
    // Two model turns, each its own request: the second carries the call and its result.
    assert.equal(sent.length, 2);
    assert.deepEqual(sent[0].tools.map((t) => t.function.name), ['every__echo']);
    assert.equal(sent[0].tool_choice, 'required');
    const tail = sent[1].messages.slice(-2);
    assert.equal(tail[0].role, 'assistant');
    assert.equal(tail[0].tool_calls[0].function.name, 'every__echo');
    assert.deepEqual(tail[1], { role: 'tool', tool_call_id: tail[0].tool_calls[0].id, content: `Echo: ${args.message}` });
    // Each step has its own ledger row and usage; the summary adds them up and keeps tool time apart.
    await reply.getByTestId('reply-steps').locator('summary').click();
    const steps = reply.getByTestId('reply-step');
    assert.equal(await steps.count(), 2);
    let completion = 0;
    const ids = [];
    const turns = new Set();
    for (const i of [0, 1]) {
      const id = await steps.nth(i).getAttribute('data-response-id');
      assert.ok(id, `step ${i} has a response id`);
      const entry = await ledgerEntry(id);
      assert.ok(entry, `step ${i} is in the ledger`);
      assert.deepEqual(entry.finish_reasons, ['tool_calls']);
      assert.equal(Number(await steps.nth(i).getAttribute('data-completion')), entry.usage.completion_tokens);
      completion += entry.usage.completion_tokens;
      ids.push(id);
      turns.add(entry.turn);
    }
    // Both model turns are rows of one chat turn in the ledger, and only they are.
    assert.equal(turns.size, 1, [...turns].join(' '));
    const [turn] = turns;
    assert.ok(turn, 'the rows name their chat turn');
    const byTurn = await api(`/v1/usage?turn=${encodeURIComponent(turn)}`);
    assert.deepEqual(byTurn.json.data.map((e) => e.id).sort(), [...ids].sort());
    const summary = await reply.getByTestId('reply-steps').locator('summary').innerText();
    assert.match(summary, new RegExp(`^2 steps · ${completion} tokens in all`));
    assert.match(await reply.getByTestId('tool-time').innerText(), /1 tool call, \d+\.\d\d s in tools/);
    await screenshot(page, 'mcp-done');
    // The store keeps the calls and their results with each step.
    await page.waitForFunction(() => [...document.querySelectorAll('[data-testid=message-assistant]')].pop()?.dataset.saved === 'saved');
    const conv = await storedConversation(await currentServerId(page));
    const pieces = conv.messages.at(-1).pieces;
    assert.equal(pieces.length, 2);
    assert.equal(pieces[0].metadata.tool_uses[0].state, 'done');
    assert.equal(pieces[0].metadata.tool_uses[0].result, `Echo: ${args.message}`);
    assert.deepEqual(pieces.map((p) => p.metadata.turn), [turn, turn]);
    // After a reload the calls show as they ended, and the reply links to its rows.
    await page.reload();
    await page.locator('[data-testid=tool-use][data-state=done]').first().waitFor();
    const again = lastReply(page);
    await again.getByTestId('reply-steps').locator('summary').click();
    await again.getByTestId('turn-ledger').click();
    await page.getByTestId('usage-filter-turn').waitFor();
    await page.waitForFunction(() => document.querySelector('[data-testid=usage-count]')?.textContent?.trim() === '2');
    await screenshot(page, 'mcp-turn-ledger');
    await page.getByTestId('usage-filter-turn-clear').click();
    await page.getByTestId('usage-filter-turn').waitFor({ state: 'detached' });
  });
});

test('Deny sends the refusal to the model instead of a result', async () => {
  await configure(FILE());
  await usePage(await openPage(browser, { width: 420 }), 'mcp-deny-420', async (page) => {
    const sent = chatRequests(page);
    await toolChat(page, { steps: 2 });
    await send(page, ASK);
    await page.locator('[data-testid=tool-use][data-state=asking]').waitFor({ timeout: 120_000 });
    await screenshot(page, 'mcp-asking-420');
    await lastReply(page).getByTestId('tool-deny').click();
    await loopEnded(page);
    const use = lastReply(page).getByTestId('tool-use').first();
    assert.equal(await use.getAttribute('data-state'), 'denied');
    assert.equal(await use.getByTestId('tool-result').count(), 0, 'nothing ran');
    assert.equal(sent.length, 2);
    assert.equal(sent[1].messages.at(-1).role, 'tool');
    assert.equal(sent[1].messages.at(-1).content, 'The user did not allow this tool call.');
  });
});

test('read-only tools run without asking when the chat allows it ahead', async () => {
  await configure(FILE());
  await usePage(await openPage(browser), 'mcp-read-only', async (page) => {
    await toolChat(page, { steps: 2, autoReadOnly: true });
    await send(page, ASK);
    await loopEnded(page);
    const uses = lastReply(page).getByTestId('tool-use');
    // echo says readOnlyHint: never asked, run at once.
    assert.equal(await uses.first().getAttribute('data-state'), 'done');
    assert.match(await uses.first().getByTestId('tool-state').innerText(), /allowed ahead/);
    assert.equal(await page.getByTestId('tool-allow').count(), 0);
  });
});

test('a server that dies mid-call is an error in the chat, and the chat goes on', async () => {
  const file = FILE();
  file.mcpServers.every.disabled = true;
  file.mcpServers.fragile.disabled = false;
  await configure(file);
  await usePage(await openPage(browser), 'mcp-crash', async (page) => {
    const sent = chatRequests(page);
    await toolChat(page, { steps: 2 });
    await send(page, 'Crash the server.');
    const use = lastReply(page).getByTestId('tool-use').first();
    await page.locator('[data-testid=tool-use][data-state=asking]').waitFor({ timeout: 120_000 });
    assert.equal(await use.getAttribute('data-tool'), 'fragile__crash');
    await use.getByTestId('tool-allow').click();
    await loopEnded(page);
    assert.equal(await use.getAttribute('data-state'), 'failed');
    assert.match(await use.getByTestId('tool-result-text').textContent(), /MCP server 'fragile' failed/);
    // The model read the failure, and the chat takes the next message.
    assert.match(sent[1].messages.at(-1).content, /^The tool could not run: MCP server 'fragile' failed/);
    await page.getByTestId('setting-tools').setChecked(false);
    await send(page, 'What is the capital of France? Answer in one sentence.');
    await lastReply(page).getByTestId('finish-badge').waitFor({ timeout: 120_000 });
    assert.equal(await lastReply(page).getByTestId('tool-use').count(), 0);
  });
});

test('the filesystem server on a temporary folder runs an allowed call', async () => {
  // The reference filesystem server on a folder of its own, offering one tool that needs no arguments.
  const dir = mkdtempSync(join(tmpdir(), 'shoal-ui-files-'));
  await configure({ mcpServers: { files: { command: 'node', args: [FILESYSTEM, dir], enabledTools: ['list_allowed_directories'] } } });
  await usePage(await openPage(browser), 'mcp-files', async (page) => {
    await toolChat(page, { steps: 2 });
    await send(page, 'Which folders may you read?');
    const use = lastReply(page).getByTestId('tool-use').first();
    await page.locator('[data-testid=tool-use][data-state=asking]').waitFor({ timeout: 120_000 });
    assert.equal(await use.getAttribute('data-tool'), 'files__list_allowed_directories');
    // The server's own hint is shown beside the call.
    assert.match(await use.innerText(), /read-only/);
    await use.getByTestId('tool-allow').click();
    await loopEnded(page);
    assert.equal(await use.getAttribute('data-state'), 'done');
    assert.ok((await use.getByTestId('tool-result-text').textContent()).includes(dir), 'the tool read its folder');
  });
});

test('Always allow is kept by the server: later calls run without asking, until the Server page forgets it', async () => {
  await configure(FILE());
  await usePage(await openPage(browser), 'mcp-always', async (page) => {
    await toolChat(page, { steps: 3 });
    await send(page, ASK);
    const uses = lastReply(page).getByTestId('tool-use');
    await page.locator('[data-testid=tool-use][data-state=asking]').waitFor({ timeout: 120_000 });
    await uses.first().getByTestId('tool-always').click();
    await loopEnded(page);
    // The first call ran on the answer; the next one was not asked about.
    assert.equal(await uses.first().getAttribute('data-state'), 'done');
    assert.equal(await uses.nth(1).getAttribute('data-state'), 'done');
    assert.match(await uses.nth(1).getByTestId('tool-state').innerText(), /allowed ahead/);
  });
  // The server keeps the answer, in the file, for every window.
  const kept = await api('/v1/mcp/config');
  assert.deepEqual(kept.json.mcpServers.every.alwaysAllow, ['echo']);
  const tools = await api('/v1/mcp/tools');
  assert.equal(tools.json.data.find((t) => t.name === 'echo').always_allow, true);
  await usePage(await openPage(browser, { path: '/server', width: 420 }), 'mcp-forget-420', async (page) => {
    await page.getByTestId('mcp-forget').click();
    assert.match(await page.getByTestId('mcp-forgot').innerText(), /Forgot 1 “Always allow” answer/);
    assert.ok(!(await page.getByTestId('mcp-config').inputValue()).includes('alwaysAllow'), 'the file shown lost the answer');
    await screenshot(page, 'mcp-forgot-420');
  });
  assert.equal((await api('/v1/mcp/config')).json.mcpServers.every.alwaysAllow, undefined);
});

test('a call that hangs is an error in the chat after the timeout, and the model reads it', async () => {
  const file = FILE();
  file.mcpServers.every.disabled = true;
  file.mcpServers.fragile = { command: 'node', args: [FRAGILE], enabledTools: ['hang'] };
  await configure(file);
  await usePage(await openPage(browser), 'mcp-hang', async (page) => {
    const sent = chatRequests(page);
    await toolChat(page, { steps: 2 });
    await send(page, 'Wait for the tool.');
    const use = lastReply(page).getByTestId('tool-use').first();
    await page.locator('[data-testid=tool-use][data-state=asking]').waitFor({ timeout: 120_000 });
    assert.equal(await use.getAttribute('data-tool'), 'fragile__hang');
    await use.getByTestId('tool-allow').click();
    await page.locator('[data-testid=tool-use][data-state=running]').waitFor();
    await screenshot(page, 'mcp-hang-running');
    await loopEnded(page);
    assert.equal(await use.getAttribute('data-state'), 'failed');
    const said = await use.getByTestId('tool-result-text').textContent();
    assert.ok(said.includes(`did not answer within ${CALL_TIMEOUT_SECS} s`), said);
    assert.match(sent[1].messages.at(-1).content, /^The tool could not run: .*did not answer/);
    await screenshot(page, 'mcp-hang-failed');
  });
});

/** A free port on loopback. */
function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
    srv.on('error', reject);
  });
}

test('a Streamable HTTP server is called like a stdio one', async () => {
  const port = await freePort();
  const web = spawn('node', [EVERYTHING, 'streamableHttp'], { env: { ...process.env, PORT: String(port) }, stdio: ['ignore', 'ignore', 'pipe'] });
  try {
    await new Promise((resolve, reject) => {
      let said = '';
      web.stderr.on('data', (d) => {
        said += d;
        if (said.includes('listening on port')) resolve();
      });
      web.on('exit', (code) => reject(new Error(`the HTTP server exited (${code}): ${said}`)));
    });
    await configure({ mcpServers: { web: { url: `http://127.0.0.1:${port}/mcp`, enabledTools: ['echo'] } } });
    await usePage(await openPage(browser, { width: 420 }), 'mcp-http-420', async (page) => {
      await toolChat(page, { steps: 2 });
      await send(page, ASK);
      const use = lastReply(page).getByTestId('tool-use').first();
      await page.locator('[data-testid=tool-use][data-state=asking]').waitFor({ timeout: 120_000 });
      assert.equal(await use.getAttribute('data-tool'), 'web__echo');
      const args = JSON.parse(await use.getByTestId('tool-args').innerText());
      await use.getByTestId('tool-allow').click();
      await loopEnded(page);
      assert.equal(await use.getAttribute('data-state'), 'done');
      assert.equal(await use.getByTestId('tool-result-text').textContent(), `Echo: ${args.message}`);
      await screenshot(page, 'mcp-http-done-420');
    });
  } finally {
    web.kill();
  }
});
