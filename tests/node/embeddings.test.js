// Embeddings through the official OpenAI and Ollama Node SDKs against one `shoal serve`
// that serves all-MiniLM-L6-v2 beside the default chat model. Vectors are checked
// against the numpy reference (tools/py/bert_reference.py in the test venv) on the
// shared corpus, token counts against the `tokenizers` package's.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import OpenAI from 'openai';
import { Ollama } from 'ollama';

import { startServer } from './shoal-server.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const EMBED_DIR = join(process.env.SHOAL_CACHE || join(ROOT, '.cache'), 'models', 'all-minilm-l6-v2-0.1.2');
const EMBED_GGUF = process.env.SHOAL_TEST_EMBED_GGUF || join(EMBED_DIR, 'all-MiniLM-L6-v2-F16.gguf');
const EMBED_HF_DIR = join(EMBED_DIR, 'hf');
const CORPUS_FILE = join(ROOT, 'tests', 'data', 'embedding-corpus.json');
const DIMS = 384;
const WINDOW = 512;
const MATCH = 0.999; // server vs the float64 reference (the GGUF's matrices are float16)
const SAME = 0.9999; // the same input embedded twice by the server
const TOO_LONG = 'word '.repeat(1000);

let server;
let openai;
let ollama;
let model; // the chat model
let embedModel;
let corpus;
let ref; // {token_counts, token_ids, vectors, dimensions}

/** Runs the numpy reference on `inputs` in the Python test venv and returns its JSON. */
function reference(inputs, dir) {
  const venv = execFileSync('bash', [join(ROOT, 'tools', 'setup-pyenv.sh')], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
  }).trim();
  const inFile = join(dir, 'inputs.json');
  const outFile = join(dir, 'reference.json');
  writeFileSync(inFile, JSON.stringify(inputs));
  execFileSync(
    join(venv, 'bin', 'python'),
    [join(ROOT, 'tools', 'py', 'bert_reference.py'), EMBED_HF_DIR, '--inputs-json', inFile, '--out', outFile],
    { stdio: ['ignore', 'inherit', 'inherit'] },
  );
  return JSON.parse(readFileSync(outFile, 'utf8'));
}

before(async () => {
  for (const need of [EMBED_GGUF, join(EMBED_HF_DIR, 'model.safetensors')]) {
    if (!existsSync(need)) throw new Error(`${need} is missing (run \`bash tools/fetch-embedding-model.sh\`)`);
  }
  corpus = JSON.parse(readFileSync(CORPUS_FILE, 'utf8'));
  const dir = mkdtempSync(join(tmpdir(), 'shoal-node-embed-'));
  try {
    ref = reference(corpus, dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  assert.equal(ref.dimensions, DIMS);
  server = await startServer('--embedding-model', EMBED_GGUF);
  model = server.model;
  const listed = await (await fetch(`${server.url}/v1/models`)).json();
  const embedding = listed.data.filter((m) => (m.embedding ?? m.shoal?.embedding) != null);
  assert.equal(embedding.length, 1, JSON.stringify(listed.data.map((m) => m.id)));
  embedModel = embedding[0].id;
  openai = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'shoal-test', maxRetries: 0, timeout: 120_000 });
  ollama = new Ollama({ host: server.url });
});

after(async () => {
  await server?.stop();
});

function cos(a, b) {
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length; i += 1) {
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  return dot / Math.sqrt(na * nb);
}

function isUnit(v) {
  assert.equal(v.length, DIMS);
  const norm = Math.sqrt(Array.from(v).reduce((s, x) => s + x * x, 0));
  assert.ok(Math.abs(norm - 1) < 1e-3, `norm ${norm}`);
}

function closeTo(got, want, at, floor = MATCH) {
  const c = cos(got, want);
  assert.ok(c >= floor, `${at}: cosine ${c} < ${floor}`);
}

/** OpenAI's base64 embedding: little-endian float32 bytes. */
function decodeBase64(s) {
  const bytes = Buffer.from(s, 'base64');
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float32Array(bytes.byteLength / 4);
  for (let i = 0; i < out.length; i += 1) out[i] = view.getFloat32(i * 4, true);
  return out;
}

const sum = (xs) => xs.reduce((a, b) => a + b, 0);

describe('openai embeddings.create', () => {
  test('floats: every corpus entry matches the reference; usage counts its tokens', async () => {
    const r = await openai.embeddings.create({ model: embedModel, input: corpus, encoding_format: 'float' });
    assert.equal(r.object, 'list');
    assert.equal(r.model, embedModel);
    assert.deepEqual(r.data.map((d) => d.index), corpus.map((_, i) => i));
    assert.equal(r.usage.prompt_tokens, sum(ref.token_counts));
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
    r.data.forEach((d, i) => {
      assert.ok(Array.isArray(d.embedding));
      isUnit(d.embedding);
      closeTo(d.embedding, ref.vectors[i], `entry ${i}`);
    });
  });

  test('base64 decodes to the float vector; the SDK default decodes it itself', async () => {
    const input = corpus.slice(0, 4);
    const floats = await openai.embeddings.create({ model: embedModel, input, encoding_format: 'float' });
    const packed = await openai.embeddings.create({ model: embedModel, input, encoding_format: 'base64' });
    const dflt = await openai.embeddings.create({ model: embedModel, input });
    assert.equal(packed.usage.prompt_tokens, sum(ref.token_counts.slice(0, 4)));
    assert.equal(dflt.usage.prompt_tokens, packed.usage.prompt_tokens);
    input.forEach((_, i) => {
      assert.equal(typeof packed.data[i].embedding, 'string');
      const decoded = decodeBase64(packed.data[i].embedding);
      assert.equal(decoded.length, DIMS);
      const f = Float32Array.from(floats.data[i].embedding);
      for (let k = 0; k < DIMS; k += 1) assert.ok(Math.abs(decoded[k] - f[k]) <= 1e-6, `entry ${i}[${k}]`);
      const d = dflt.data[i].embedding;
      assert.equal(d.length, DIMS);
      closeTo(d, f, `default encoding entry ${i}`, SAME);
      closeTo(decoded, ref.vectors[i], `base64 entry ${i}`);
    });
  });

  test('token arrays are embedded as given', async () => {
    assert.deepEqual(ref.token_ids[0], [101, 7592, 102]); // "Hello" -> [CLS] hello [SEP]
    const r = await openai.embeddings.create({ model: embedModel, input: [[101, 7592, 102]], encoding_format: 'float' });
    assert.equal(r.usage.prompt_tokens, 3);
    closeTo(r.data[0].embedding, ref.vectors[0], '[[101, 7592, 102]]');
    const ids = await openai.embeddings.create({ model: embedModel, input: [ref.token_ids[6]], encoding_format: 'float' });
    closeTo(ids.data[0].embedding, ref.vectors[6], 'CJK entry as ids');
  });

  test('errors: a chat model, dimensions, an empty input', async () => {
    const is400 = (pattern) => (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && pattern.test(e.message);
    await assert.rejects(openai.embeddings.create({ model, input: 'Hello' }), is400(/not an embedding model/));
    await assert.rejects(openai.embeddings.create({ model: embedModel, input: 'Hello', dimensions: 64 }), is400(/dimensions/));
    await assert.rejects(openai.embeddings.create({ model: embedModel, input: '' }), is400(/empty/));
    await assert.rejects(
      openai.chat.completions.create({ model: embedModel, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 4 }),
      is400(/is an embedding model/),
    );
    const r = await openai.embeddings.create({ model: embedModel, input: corpus[1], encoding_format: 'float' });
    closeTo(r.data[0].embedding, ref.vectors[1], 'after the errors');
  });
});

describe('ollama embed (official ollama-js client)', () => {
  test('embed: vectors, prompt_eval_count and durations', async () => {
    const r = await ollama.embed({ model: embedModel, input: corpus });
    assert.equal(r.embeddings.length, corpus.length);
    assert.equal(r.prompt_eval_count, sum(ref.token_counts));
    assert.ok(Number.isInteger(r.total_duration) && r.total_duration > 0);
    assert.ok(Number.isInteger(r.load_duration) && r.load_duration >= 0);
    r.embeddings.forEach((v, i) => {
      isUnit(v);
      closeTo(v, ref.vectors[i], `ollama entry ${i}`);
    });
    const latest = await ollama.embed({ model: `${embedModel}:latest`, input: corpus[8] });
    closeTo(latest.embeddings[0], r.embeddings[8], 'name:latest', SAME);
  });

  test('truncate: on by default and when asked, a 400 when off', async () => {
    const cut = await ollama.embed({ model: embedModel, input: TOO_LONG, truncate: true });
    assert.equal(cut.prompt_eval_count, WINDOW);
    isUnit(cut.embeddings[0]);
    assert.equal((await ollama.embed({ model: embedModel, input: TOO_LONG })).prompt_eval_count, WINDOW);
    await assert.rejects(ollama.embed({ model: embedModel, input: TOO_LONG, truncate: false }), (e) => e.status_code === 400);
  });

  test('legacy embeddings equals embed', async () => {
    const legacy = await ollama.embeddings({ model: embedModel, prompt: corpus[2] });
    const now = await ollama.embed({ model: embedModel, input: corpus[2] });
    closeTo(legacy.embedding, now.embeddings[0], 'legacy vs embed', SAME);
    closeTo(legacy.embedding, ref.vectors[2], 'legacy vs reference');
  });
});
