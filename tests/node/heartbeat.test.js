// Heartbeats of a quiet stream through the official OpenAI Node SDK's stream
// helpers: the chunks and events reach the caller before the first token (where
// agents' stream-idle guards watch), and the helpers' accumulated replies are
// whole. The server beats after 1 s without data; each prompt takes seconds to
// read on the default model, and opens with its own line so none is cached.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import OpenAI from 'openai';

import { startServer } from './shoal-server.js';

const QUESTION = 'What is the capital of France? Answer in one sentence.';

let server;
let openai;
let model;

function longPrompt(opening) {
  const rows = Array.from({ length: 180 }, (_, i) => `item${i} weighs ${(i * 7) % 13} kg.`).join(' ');
  return `${opening}\n${rows}\n${QUESTION}`;
}

before(async () => {
  server = await startServer('--prefix-cache-mb', '0', '--stream-heartbeat-secs', '1');
  model = server.model;
  openai = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'shoal-test', maxRetries: 0, timeout: 120_000 });
});

after(async () => {
  await server?.stop();
});

test('chat heartbeats reach the caller and the accumulated reply is whole', async () => {
  const stream = openai.chat.completions.stream({
    model, messages: [{ role: 'user', content: longPrompt('Chat.') }], max_tokens: 24, temperature: 0,
    stream_options: { include_usage: true },
  });
  const before = [];
  let text = '';
  for await (const chunk of stream) {
    const delta = chunk.choices[0]?.delta;
    if (!delta) continue;
    if (delta.content) text += delta.content;
    else if (!text) before.push(delta);
  }
  const final = await stream.finalChatCompletion();
  assert.ok(before.length >= 2, JSON.stringify(before));
  assert.equal(before[0].role, 'assistant');
  assert.ok(before.slice(1).every((d) => d.role === undefined && !d.content), JSON.stringify(before));
  const msg = final.choices[0].message;
  assert.equal(msg.role, 'assistant');
  assert.equal(msg.content, text);
  assert.equal(final.usage.completion_tokens > 0, true);
});

test('responses heartbeats are in_progress events the stream helper accepts', async () => {
  const stream = openai.responses.stream({
    model, input: longPrompt('Responses.'), max_output_tokens: 24, temperature: 0,
  });
  const kinds = [];
  let text = '';
  for await (const ev of stream) {
    kinds.push(ev.type);
    if (ev.type === 'response.output_text.delta') text += ev.delta;
  }
  const final = await stream.finalResponse();
  const head = kinds.slice(0, kinds.indexOf('response.output_item.added'));
  assert.equal(head[0], 'response.created');
  assert.equal(head.filter((k) => k === 'response.created').length, 1);
  assert.ok(head.filter((k) => k === 'response.in_progress').length >= 2, head.join(' '));
  assert.equal(final.status, 'completed');
  assert.ok(text.length > 0);
  assert.equal(final.output_text, text);
  assert.ok(final.usage.output_tokens > 0);
});
