// Starts `shoal serve --port 0` for the Node SDK tests and stops it again.
// The binary comes from SHOAL_BIN (default <repo>/target/release/shoal); the
// server itself reads SHOAL_MODEL.
import { spawn } from 'node:child_process';
import { accessSync, constants, createWriteStream, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
export const SHOAL_BIN = process.env.SHOAL_BIN || resolve(here, '..', '..', 'target', 'release', 'shoal');
const LISTEN_RE = /shoal listening on (http:\/\/\S+) \(model (.+)\)/;
const STARTUP_TIMEOUT_MS = 180_000;

export async function startServer(...extra) {
  try {
    accessSync(SHOAL_BIN, constants.X_OK);
  } catch {
    throw new Error(`shoal binary not found or not executable: ${SHOAL_BIN} (set SHOAL_BIN)`);
  }
  const dir = mkdtempSync(join(tmpdir(), 'shoal-node-sdk-'));
  const logPath = join(dir, 'server.log');
  const log = createWriteStream(logPath);
  // A store of its own, never the user's.
  // A model library of its own too (pulled models land there), never the user's.
  const proc = spawn(SHOAL_BIN, ['serve', '--port', '0', '--db', join(dir, 'conversations.sqlite'), ...extra], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, HF_HOME: join(dir, 'hf-home') },
  });
  proc.stderr.pipe(log);
  const logTail = () => {
    try {
      return readFileSync(logPath, 'utf8').split('\n').slice(-40).join('\n');
    } catch {
      return '(no server log)';
    }
  };
  const found = await new Promise((resolveFound, reject) => {
    let buf = '';
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      reject(new Error(`shoal serve did not start within ${STARTUP_TIMEOUT_MS} ms\n${logTail()}`));
    }, STARTUP_TIMEOUT_MS);
    proc.stdout.on('data', (chunk) => {
      buf += chunk.toString();
      const m = LISTEN_RE.exec(buf);
      if (m) {
        clearTimeout(timer);
        resolveFound({ url: m[1], model: m[2] });
      }
    });
    proc.on('exit', (code, signal) => {
      clearTimeout(timer);
      // Give the log stream a moment to flush before reading it.
      setTimeout(
        () => reject(new Error(`shoal serve exited early (code ${code}, signal ${signal})\n${logTail()}`)),
        100,
      );
    });
  });
  proc.stdout.resume();
  return {
    ...found,
    proc,
    logTail,
    async stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      const exited = new Promise((r) => proc.once('exit', r));
      proc.kill('SIGTERM');
      const timer = setTimeout(() => proc.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
      log.end();
    },
  };
}

/** The server's /v1/usage ledger, newest first. */
export async function ledger(server) {
  const res = await fetch(`${server.url}/v1/usage?limit=1000`);
  if (!res.ok) throw new Error(`GET /v1/usage: ${res.status}`);
  return (await res.json()).data;
}

/** Waits until the ledger has an entry for `id` that satisfies `want`. */
export async function ledgerEntry(server, id, want = () => true, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    last = (await ledger(server)).find((e) => e.id === id);
    if (last && want(last)) return last;
    if (Date.now() > deadline) {
      throw new Error(`no matching ledger entry for ${id} after ${timeoutMs} ms; last seen ${JSON.stringify(last)}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}
