// Desktop smoke test: drives the built app through tauri-driver (W3C
// WebDriver over WebKitWebDriver) and its tray menu over D-Bus.
//
// Run inside an X server and a D-Bus session, e.g.
//   xvfb-run -a dbus-run-session -- node smoke.mjs APP TAURI_DRIVER OUT_DIR
//
// It checks that: the window shows the chat UI served by the in-process
// server; a chat message sent with the settings untouched gets a reply that
// ends by itself, and a greedy one a reply with a finish badge; the tray menu is
// exported over D-Bus (StatusNotifierItem + com.canonical.dbusmenu) with the
// status line and items; Stop/Start Server work from the menu; Copy API URL
// fills the clipboard; closing the window keeps the server up; a `shoal serve`
// node joins the app's cluster and a model split over both runs its second
// half in a shard the app starts as itself (on llama.cpp: the split is refused
// and the model placed whole); Quit lets an open stream finish with its final
// event, then the process exits. SHOAL_BACKEND picks the backend served.
import { spawn, execFileSync } from 'node:child_process';
import { mkdirSync, openSync, readFileSync, readlinkSync, writeFileSync, existsSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { createServer } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));

const [app, driver, outDir] = process.argv.slice(2).map((p) => resolve(p));
if (!app || !driver || !outDir) {
  console.error('usage: node smoke.mjs APP TAURI_DRIVER OUT_DIR');
  process.exit(2);
}
mkdirSync(outDir, { recursive: true });

const checks = [];
let failed = 0;
function pass(name, detail = '') {
  checks.push(name);
  console.log(`ok   ${name}${detail ? ` — ${detail}` : ''}`);
}
function fail(name, detail) {
  failed += 1;
  console.log(`FAIL ${name} — ${detail}`);
}
function check(name, cond, detail = '') {
  if (cond) pass(name, detail);
  else fail(name, detail || 'condition false');
  return cond;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitFor(what, fn, timeoutMs, everyMs = 250) {
  const until = Date.now() + timeoutMs;
  let last;
  while (Date.now() < until) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    await sleep(everyMs);
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${last.message}` : ''}`);
}

function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once('error', rej);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

// ---- WebDriver (W3C) over plain HTTP ----
let wd;
async function wdCall(method, path, body) {
  const r = await fetch(`${wd}${path}`, {
    method,
    headers: body ? { 'content-type': 'application/json' } : {},
    body: body ? JSON.stringify(body) : undefined,
  });
  const json = await r.json().catch(() => ({}));
  if (!r.ok) {
    const v = json.value ?? {};
    throw new Error(`${method} ${path}: ${r.status} ${v.error ?? ''} ${v.message ?? ''}`.trim());
  }
  return json.value;
}
const ELEMENT = 'element-6066-11e4-a52e-4f735466cecf';
async function find(session, testid) {
  const v = await wdCall('POST', `/session/${session}/element`, {
    using: 'css selector',
    value: `[data-testid="${testid}"]`,
  });
  return v[ELEMENT];
}
async function findAll(session, testid) {
  const v = await wdCall('POST', `/session/${session}/elements`, {
    using: 'css selector',
    value: `[data-testid="${testid}"]`,
  });
  return v.map((e) => e[ELEMENT]);
}

// ---- D-Bus through gdbus ----
function gdbus(args) {
  return execFileSync('gdbus', args, { encoding: 'utf8', timeout: 10_000 });
}
/** The app's connections to the session bus (GTK, accessibility, ... each has one). */
function busNamesOfPid(pid) {
  const found = [];
  const names = gdbus([
    'call', '--session', '--dest', 'org.freedesktop.DBus', '--object-path', '/org/freedesktop/DBus',
    '--method', 'org.freedesktop.DBus.ListNames',
  ]).match(/':[0-9.]+'/g) ?? [];
  for (const quoted of names) {
    const name = quoted.slice(1, -1);
    try {
      const out = gdbus([
        'call', '--session', '--dest', 'org.freedesktop.DBus', '--object-path', '/org/freedesktop/DBus',
        '--method', 'org.freedesktop.DBus.GetConnectionUnixProcessID', name,
      ]);
      const m = out.match(/uint32 (\d+)/);
      if (m && Number(m[1]) === pid) found.push(name);
    } catch {
      // The connection went away meanwhile.
    }
  }
  return found;
}
function objectPaths(dest, path = '/', found = []) {
  let xml;
  try {
    xml = gdbus(['introspect', '--session', '--dest', dest, '--object-path', path, '--xml']);
  } catch {
    // Not every connection answers introspection.
    return found;
  }
  found.push({ path, xml });
  for (const m of xml.matchAll(/<node name="([^"]+)"/g)) {
    objectPaths(dest, path === '/' ? `/${m[1]}` : `${path}/${m[1]}`, found);
  }
  return found;
}
/** The menu's items as {id, label, enabled}, from com.canonical.dbusmenu.GetLayout. */
function menuItems(dest, menuPath) {
  const out = gdbus([
    'call', '--session', '--dest', dest, '--object-path', menuPath,
    '--method', 'com.canonical.dbusmenu.GetLayout', '--', '0', '-1', '@as []',
  ]);
  const items = [];
  for (const m of out.matchAll(/\((\d+), \{([^}]*)\}/g)) {
    const props = m[2];
    const label = props.match(/'label': <'((?:[^'\\]|\\.)*)'>/);
    const enabled = props.match(/'enabled': <(true|false)>/);
    const type = props.match(/'type': <'([^']*)'>/);
    items.push({
      id: Number(m[1]),
      // GTK labels mark mnemonics with `_` and escape a literal one as `__`.
      label: label ? label[1].replace(/_(.)/g, '$1') : '',
      enabled: enabled ? enabled[1] === 'true' : true,
      type: type ? type[1] : 'standard',
    });
  }
  return items;
}
function clickMenu(dest, menuPath, id) {
  gdbus([
    'call', '--session', '--dest', dest, '--object-path', menuPath,
    '--method', 'com.canonical.dbusmenu.Event', String(id), 'clicked', '<int32 0>', '0',
  ]);
}

function pidOfApp() {
  const out = execFileSync('ps', ['-eo', 'pid='], { encoding: 'utf8' });
  for (const line of out.split('\n')) {
    const pid = Number(line.trim());
    if (!pid) continue;
    try {
      if (readlinkSync(`/proc/${pid}/exe`) === app) return pid;
    } catch {
      // Not ours to read, or gone.
    }
  }
  return null;
}
const alive = (pid) => existsSync(`/proc/${pid}`) && !/\) Z /.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));

async function health(base) {
  try {
    const r = await fetch(`${base}health`, { signal: AbortSignal.timeout(3000) });
    return r.ok;
  } catch {
    return false;
  }
}

/** The app's tray item and menu on the session bus, checked on the way. */
async function findTray(pid) {
  const names = await waitFor('the app on the session bus', async () => {
    const n = busNamesOfPid(pid);
    return n.length ? n : null;
  }, 10_000);
  pass('app is on the session bus', names.join(' '));
  let bus;
  let item;
  await waitFor('the tray item', async () => {
    for (const name of names) {
      item = objectPaths(name).find((p) => /interface name="org\.kde\.StatusNotifierItem"/.test(p.xml));
      if (item) {
        bus = name;
        return true;
      }
    }
    return false;
  }, 10_000, 500);
  pass('StatusNotifierItem exported', `${bus} ${item.path}`);
  const props = gdbus([
    'call', '--session', '--dest', bus, '--object-path', item.path,
    '--method', 'org.freedesktop.DBus.Properties.GetAll', 'org.kde.StatusNotifierItem',
  ]);
  const menuPath = props.match(/'Menu': <objectpath '([^']+)'>/)?.[1];
  if (!check('item names its dbusmenu', Boolean(menuPath), menuPath ?? props.slice(0, 200))) {
    throw new Error('no menu path');
  }
  return { bus, menuPath };
}

// A `shoal serve` node (the CLI built beside the app) joins the app's
// cluster; a pipeline instance over the node and the app must answer like
// the node alone, with the app's layers in a `shoal-desktop shard` process.
async function clusterSplit(base) {
  const cli = join(dirname(app), 'shoal');
  if (!check('shoal CLI beside the app (peer node)', existsSync(cli), cli)) return;
  const node = spawn(
    cli,
    ['serve', '--port', '0', '--no-mdns', '--prefix-cache-mb', '0',
     '--cluster-secret', CLUSTER_SECRET, '--peer', new URL(base).host],
    {
      stdio: ['ignore', 'pipe', openSync(join(outDir, 'peer-node.log'), 'w')],
      env: {
        ...process.env,
        XDG_CONFIG_HOME: join(outDir, 'peer-xdg'),
        XDG_DATA_HOME: join(outDir, 'peer-data'),
        HF_HOME: join(outDir, 'peer-hf'),
      },
    },
  );
  try {
    const line = await new Promise((ok, no) => {
      createInterface({ input: node.stdout }).once('line', ok);
      node.once('exit', (c) => no(new Error(`peer node exited (${c})`)));
    });
    const nodeBase = `http://${line.split('http://')[1].split(' ')[0]}/`;
    const post = async (b, path, body) =>
      (await fetch(`${b}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      })).json();
    const nodes = await waitFor('the node and the app to see each other', async () => {
      const r = await (await fetch(`${nodeBase}v1/cluster/nodes`)).json();
      return r.nodes.length === 2 && r.nodes.every((n) => n.status === 'online') ? r.nodes : null;
    }, 30_000);
    pass('a node joins the app\'s cluster', nodes.map((n) => `${n.name}${n.self ? '' : ' (app)'}`).join(', '));
    const listed = (await (await fetch(`${base}v1/models`)).json()).data[0];
    const model = listed.id;
    const ask = {
      model, max_tokens: 12, temperature: 0,
      messages: [{ role: 'user', content: 'What is the capital of France?' }],
    };
    const single = await post(nodeBase, 'v1/chat/completions', ask);
    const ids = [nodes.find((n) => n.self).id, nodes.find((n) => !n.self).id];
    if (listed.shoal?.backend === 'llama') {
      // Splitting by layers runs over MLX's ring: a llama.cpp model is
      // refused a split, and is placed whole on one node (here the app).
      const refused = await post(nodeBase, 'v1/instances', { model, nodes: ids, sharding: 'pipeline' });
      check('a llama.cpp model is refused a pipeline split',
        /llama\.cpp/.test(refused.error?.message ?? '') && /whole/.test(refused.error?.message ?? ''),
        JSON.stringify(refused).slice(0, 300));
      const whole = await post(nodeBase, 'v1/instances', { model, nodes: [ids[1]] });
      check('a llama.cpp model is placed whole on the app', whole.status === 'ready' && whole.entry === ids[1],
        JSON.stringify(whole).slice(0, 300));
      if (whole.id) await fetch(`${nodeBase}v1/instances/${whole.id}`, { method: 'DELETE' });
      return;
    }
    const inst = await post(nodeBase, 'v1/instances', { model, nodes: ids, sharding: 'pipeline' });
    check('pipeline instance over the node and the app', inst.status === 'ready',
      JSON.stringify(inst.layers ?? inst).slice(0, 300));
    let shard = '';
    try {
      shard = execFileSync('pgrep', ['-af', 'shoal-desktop shard'], { encoding: 'utf8' });
    } catch {}
    check('the app runs its layers as `shoal-desktop shard`', /--layers \d+:\d+/.test(shard), shard.trim().slice(0, 200));
    const split = await post(nodeBase, 'v1/chat/completions', ask);
    const same = (x) => JSON.stringify([x.choices?.[0]?.message, x.choices?.[0]?.finish_reason, x.usage]);
    check('split model answers like one node', same(split) === same(single), same(split));
    if (inst.id) await fetch(`${nodeBase}v1/instances/${inst.id}`, { method: 'DELETE' });
  } finally {
    node.kill();
  }
}

// ---- the run ----
const t0 = Date.now();
const port = await freePort();
const nativePort = await freePort();
const config = join(outDir, 'config.toml');
// Isolated settings: a free port, the model from SHOAL_MODEL (set by make),
// a cluster secret for the split test (static peers only).
const CLUSTER_SECRET = 'smoke-cluster';
writeFileSync(config, `[server]\nport = 0\n\n[cluster]\nsecret = "${CLUSTER_SECRET}"\nmdns = false\n`);
const driverLog = join(outDir, 'tauri-driver.log');
const driverProc = spawn(driver, ['--port', String(port), '--native-port', String(nativePort)], {
  stdio: ['ignore', 'pipe', 'pipe'],
});
const logChunks = [];
driverProc.stdout.on('data', (d) => logChunks.push(d));
driverProc.stderr.on('data', (d) => logChunks.push(d));
wd = `http://127.0.0.1:${port}`;
let session;
try {
  await waitFor('tauri-driver', async () => (await fetch(`${wd}/status`)).ok, 20_000);
  session = (
    await wdCall('POST', '/session', {
      capabilities: {
        alwaysMatch: {
          'tauri:options': { application: app, args: ['--config', config] },
        },
      },
    })
  ).sessionId;
  pass('session', `tauri-driver on :${port} launched ${app}`);

  // The window starts on the bundled loading page and moves to the server.
  const url = await waitFor(
    'the chat window to load the server URL',
    async () => {
      const u = await wdCall('GET', `/session/${session}/url`);
      return /^http:\/\/127\.0\.0\.1:\d+\/$/.test(u) ? u : null;
    },
    120_000,
  );
  pass('window loads the in-process server', url);
  const title = await wdCall('GET', `/session/${session}/title`);
  check('page title', /shoal/i.test(title), JSON.stringify(title));
  // The backend the app serves on is the one asked for (desktop.sh sets
  // SHOAL_BACKEND for each run; `auto` names no backend to compare with).
  const backendAsked = process.env.SHOAL_BACKEND ?? 'auto';
  if (backendAsked !== 'auto') {
    const served = (await (await fetch(`${url}v1/models`)).json()).data[0]?.shoal?.backend;
    check(`the app serves its model on ${backendAsked}`, served === backendAsked, `shoal.backend = ${served}`);
  }

  const input = await waitFor('the composer', () => find(session, 'composer-input'), 30_000);
  // The model list must be loaded before a message can go out.
  await waitFor(
    'a model to be picked',
    async () => {
      const picker = await find(session, 'model-picker');
      const v = await wdCall('GET', `/session/${session}/element/${picker}/property/value`);
      return v ? v : null;
    },
    30_000,
  );
  // Types the question, sends it and waits for the reply's finish badge (the
  // wait guards against a hang); resolves with the finish, its label and the
  // reply's text.
  const ask = async (text = 'What is the capital of France? Answer in one sentence.') => {
    await wdCall('POST', `/session/${session}/element/${input}/value`, { text });
    const send = await waitFor('the send button to be enabled', async () => {
      const b = await find(session, 'send-button');
      return (await wdCall('GET', `/session/${session}/element/${b}/enabled`)) ? b : null;
    }, 10_000);
    const sentAt = Date.now();
    const before = (await findAll(session, 'finish-badge')).length;
    await wdCall('POST', `/session/${session}/element/${send}/click`, {});
    const badge = await waitFor('the finish badge', async () => (await findAll(session, 'finish-badge'))[before], 300_000, 500);
    const finish = await wdCall('GET', `/session/${session}/element/${badge}/attribute/data-finish`);
    const label = await wdCall('GET', `/session/${session}/element/${badge}/text`);
    const replies = await findAll(session, 'assistant-content');
    const reply = replies.length
      ? await wdCall('GET', `/session/${session}/element/${replies[replies.length - 1]}/text`)
      : '';
    return { finish, label, reply, secs: ((Date.now() - sentAt) / 1000).toFixed(1) };
  };
  // First as a first-time user would: the settings untouched, the model's own
  // sampling defaults and the chat's default token cap. The reply ends by
  // itself, at the model's end of turn or at the cap.
  const first = await ask();
  check(
    'chat reply with the defaults untouched ends by itself',
    ['stop', 'length'].includes(first.finish) && first.reply.trim().length > 0,
    `finish=${first.finish} badge=${JSON.stringify(first.label)} in ${first.secs} s; reply=${JSON.stringify(first.reply.slice(0, 80))}`,
  );
  // Then greedy in a new chat, so the reply is the one short sentence on every run.
  const newChat = await find(session, 'new-chat');
  await wdCall('POST', `/session/${session}/element/${newChat}/click`, {});
  if (!(await find(session, 'settings-panel').catch(() => null))) {
    const toggle = await find(session, 'settings-toggle');
    await wdCall('POST', `/session/${session}/element/${toggle}/click`, {});
  }
  const temperature = await waitFor('the temperature setting', () => find(session, 'setting-temperature'), 10_000);
  await wdCall('POST', `/session/${session}/element/${temperature}/clear`, {});
  await wdCall('POST', `/session/${session}/element/${temperature}/value`, { text: '0' });
  const greedy = await ask();
  check(
    'chat reply with finish badge',
    greedy.finish === 'stop' && greedy.reply.trim().length > 0,
    `finish=${greedy.finish} badge=${JSON.stringify(greedy.label)} in ${greedy.secs} s; reply=${JSON.stringify(greedy.reply.slice(0, 80))}`,
  );
  const shot = await wdCall('GET', `/session/${session}/screenshot`);
  writeFileSync(join(outDir, 'chat.png'), Buffer.from(shot, 'base64'));
  pass('screenshot', join(outDir, 'chat.png'));

  // A tool from an MCP server, approved in the window: the reference server from
  // npm (tests/mcp) offering only `echo`, the small model made to call it.
  await mcpChat(session, url, ask);

  // ---- tray over D-Bus ----
  const pid = pidOfApp();
  if (!check('app process found', Boolean(pid), `pid ${pid}`)) throw new Error('no app process');
  const { bus, menuPath } = await findTray(pid);
  let items = menuItems(bus, menuPath);
  const byLabel = (re) => items.find((i) => re.test(i.label));
  const status = items.find((i) => i.type !== 'separator' && i.label);
  const base = url;
  check(
    'status line: address, model, in flight',
    status && status.label.includes(base) && /in flight/.test(status.label) && !status.enabled,
    JSON.stringify(status?.label),
  );
  for (const re of [/^Open Chat$/, /^Stop Server$/, /^Copy API URL$/, /^Quit Shoal$/]) {
    check(`menu item ${re.source}`, Boolean(byLabel(re)), items.map((i) => i.label).join(' | '));
  }

  // The Ollama port's line: off by default, then following the server-wide
  // switch (the route the window's Settings use) both ways.
  const menuShows = (re, enabled) => waitFor(`the menu to show ${re.source}`, () => {
    items = menuItems(bus, menuPath);
    const item = byLabel(re);
    return item && (enabled === undefined || item.enabled === enabled) ? item : null;
  }, 60_000).catch(() => null);
  check('Ollama port line (off)', Boolean(await menuShows(/^Ollama API: off$/, false)),
    items.map((i) => i.label).join(' | '));
  const ollamaPort = await freePort();
  const setOllama = (enabled) => fetch(`${base}v1/settings/ollama-port`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ enabled, port: ollamaPort }),
  }).then((r) => r.json());
  const switched = await setOllama(true);
  check('Ollama port line follows the switch',
    Boolean(await menuShows(new RegExp(`^Ollama API: on \\S+:${ollamaPort}$`), false)),
    `${JSON.stringify(switched)} → ${items.map((i) => i.label).join(' | ')}`);
  await setOllama(false);
  check('Ollama port line back to off', Boolean(await menuShows(/^Ollama API: off$/, false)),
    items.map((i) => i.label).join(' | '));

  // Copy API URL → clipboard.
  clickMenu(bus, menuPath, byLabel(/^Copy API URL$/).id);
  const clip = await waitFor('the clipboard', async () => {
    const c = execFileSync('xclip', ['-selection', 'clipboard', '-o'], { encoding: 'utf8', timeout: 5000 });
    return c.trim() ? c.trim() : null;
  }, 10_000).catch((e) => e.message);
  check('Copy API URL', clip === `${base}v1`, JSON.stringify(clip));

  // Stop, then start again on the same address.
  clickMenu(bus, menuPath, byLabel(/^Stop Server$/).id);
  await waitFor('the server to stop', async () => !(await health(base)), 60_000);
  // The listener closes before the tray hears the new status, so wait for
  // the menu's own change rather than reading it once.
  const start = await menuShows(/^Start Server$/, true);
  check('Stop Server', Boolean(start), items.map((i) => i.label).join(' | '));
  if (!start) throw new Error('the tray never offered Start Server');
  clickMenu(bus, menuPath, start.id);
  await waitFor('the server to start again', () => health(base), 60_000);
  check('Start Server (same address)', Boolean(await menuShows(/^Stop Server$/, true)), base);

  // Closing the window leaves the server and the tray.
  // Asked like a window manager's close button does. (WebDriver's Close
  // Window would end the session, and the driver then ends the app.)
  const asked = execFileSync('python3', [join(here, 'close_window.py'), 'Shoal'], { encoding: 'utf8' }).trim();
  await waitFor('the window to close', async () => {
    try {
      await wdCall('GET', `/session/${session}/title`);
      return false;
    } catch {
      return true;
    }
  }, 10_000);
  pass('window closed', `WM_DELETE_WINDOW sent to ${asked} window(s)`);
  await sleep(1000);
  check('window closed, app still running', alive(pid), `pid ${pid}`);
  check('window closed, server still serving', await health(base), base);
  check('window closed, tray still exported', menuItems(bus, menuPath).length > 0, menuPath);
  const windows = () =>
    Number(execFileSync('python3', [join(here, 'close_window.py'), '--count', 'Shoal'], { encoding: 'utf8' }).trim());
  check('no window left', windows() === 0, `${windows()} window(s) titled Shoal`);
  clickMenu(bus, menuPath, byLabel(/^Open Chat$/).id);
  await waitFor('Open Chat to open a window', async () => windows() === 1, 10_000);
  pass('Open Chat reopens the window');

  await clusterSplit(base);

  // Quit during a streamed reply: it ends with its final event, then the app exits.
  const models = await (await fetch(`${base}v1/models`)).json();
  const stream = await fetch(`${base}v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: models.data[0].id,
      stream: true,
      max_tokens: 16,
      messages: [{ role: 'user', content: 'Count from one to one hundred.' }],
    }),
  });
  // Quit once the first token is out: Quit cancels what is running, so the
  // stream ends with its final event at the next step (the app's 10 s grace
  // only guards against a hang).
  const reader = stream.body.getReader();
  let text = '';
  while (!text.includes('data: {')) {
    const { value, done } = await reader.read();
    if (done) break;
    text += new TextDecoder().decode(value);
  }
  const quitAt = Date.now();
  clickMenu(bus, menuPath, byLabel(/^Quit Shoal$/).id);
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    text += new TextDecoder().decode(value);
  }
  const finishes = [...text.matchAll(/"finish_reason":"([a-z_]+)"/g)].map((m) => m[1]);
  check(
    'Quit: open stream gets its final event',
    finishes.length > 0 && text.includes('data: [DONE]'),
    `finish_reason=${finishes.join(',')}${finishes.length ? '' : ` stream=${JSON.stringify(text.slice(-400))}`}`,
  );
  await waitFor('the app to exit', async () => !alive(pid), 30_000);
  check('Quit: app exited', !alive(pid), `${((Date.now() - quitAt) / 1000).toFixed(1)} s after Quit`);
  check('Quit: server no longer accepts', !(await health(base)), base);
  await wdCall('DELETE', `/session/${session}`).catch(() => {});
  session = null;

  // A model that cannot load: the window and the tray say so.
  session = (
    await wdCall('POST', '/session', {
      capabilities: {
        alwaysMatch: {
          'tauri:options': { application: app, args: ['--config', config, '--model', join(outDir, 'missing.gguf')] },
        },
      },
    })
  ).sessionId;
  const shown = await waitFor('the load error in the window', async () => {
    const p = await find(session, 'desktop-loading');
    const t = await wdCall('GET', `/session/${session}/element/${p}/text`);
    return /could not load the model/.test(t) ? t : null;
  }, 30_000);
  pass('missing model: the window says so', JSON.stringify(shown.slice(0, 100)));
  const badPid = pidOfApp();
  const bad = await findTray(badPid);
  const badStatus = await waitFor('the tray error line', async () => {
    const first = menuItems(bad.bus, bad.menuPath).find((i) => i.type !== 'separator' && i.label);
    return first && /^Error: /.test(first.label) ? first.label : null;
  }, 10_000);
  pass('missing model: the tray says so', JSON.stringify(badStatus.slice(0, 100)));
} catch (e) {
  fail('smoke', e.stack ?? String(e));
  // Leave what the window showed for whoever reads the failure.
  if (session) {
    try {
      const shot = await wdCall('GET', `/session/${session}/screenshot`);
      writeFileSync(join(outDir, 'failure.png'), Buffer.from(shot, 'base64'));
      writeFileSync(join(outDir, 'failure.html'), await wdCall('GET', `/session/${session}/source`));
      console.log(`     window at failure: ${join(outDir, 'failure.png')}, failure.html`);
    } catch {
      // The window may be gone by now.
    }
  }
} finally {
  if (session) await wdCall('DELETE', `/session/${session}`).catch(() => {});
  driverProc.kill('SIGTERM');
  await sleep(500);
  writeFileSync(driverLog, Buffer.concat(logChunks));
}
console.log(`smoke test took ${((Date.now() - t0) / 1000).toFixed(1)} s`);
console.log(`desktop: ${checks.length} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);

/**
 * One chat with an MCP tool: the app's mcp.json (desktop.sh points SHOAL_MCP_FILE
 * at the run's folder) gets the reference server, a new chat turns tools on with
 * one model turn to call in, the call is allowed in the window, and its result
 * comes back folded under it.
 */
async function mcpChat(session, url, ask) {
  const server = resolve(here, '../../tests/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js');
  if (!check('the reference MCP server is installed (make setup)', existsSync(server), server)) return;
  const put = await fetch(`${url}v1/mcp/config`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ mcpServers: { every: { command: 'node', args: [server, 'stdio'], enabledTools: ['echo'] } } }),
  });
  if (!check('mcp.json saved through the app', put.ok, `${put.status} ${await put.text()}`)) return;
  const click = async (testid) => {
    const el = await waitFor(testid, () => find(session, testid), 30_000);
    await wdCall('POST', `/session/${session}/element/${el}/click`, {});
  };
  await click('new-chat');
  if (!(await find(session, 'settings-panel').catch(() => null))) await click('settings-toggle');
  const set = async (testid, text) => {
    const el = await waitFor(testid, () => find(session, testid), 10_000);
    await wdCall('POST', `/session/${session}/element/${el}/clear`, {});
    await wdCall('POST', `/session/${session}/element/${el}/value`, { text });
  };
  await set('setting-temperature', '0');
  await click('setting-tools');
  await click('setting-tool-required');
  await set('setting-tool-steps', '2');
  // The first turn ends (its badge: tool calls) with the call waiting for the user.
  await ask('Echo the word hello.');
  const allow = await waitFor('the tool call to ask for approval', () => find(session, 'tool-allow'), 120_000, 500);
  await wdCall('POST', `/session/${session}/element/${allow}/click`, {});
  const use = await waitFor(
    'the tool to run',
    async () => {
      const el = (await findAll(session, 'tool-use'))[0];
      const state = el && (await wdCall('GET', `/session/${session}/element/${el}/attribute/data-state`));
      return state === 'done' || state === 'failed' ? el : null;
    },
    120_000,
    500,
  );
  const state = await wdCall('GET', `/session/${session}/element/${use}/attribute/data-state`);
  const result = (await findAll(session, 'tool-result-text'))[0];
  const text = result ? await wdCall('GET', `/session/${session}/element/${result}/property/textContent`) : '';
  check('an MCP tool approved in the chat ran and its result came back', state === 'done' && /^Echo: /.test(text), `${state}: ${text}`);
  await waitFor('the tool loop to end', async () => ((await find(session, 'stop-button').catch(() => null)) ? null : true), 300_000, 500);
  const shot = await wdCall('GET', `/session/${session}/screenshot`);
  writeFileSync(join(outDir, 'mcp.png'), Buffer.from(shot, 'base64'));
  pass('screenshot', join(outDir, 'mcp.png'));
}
