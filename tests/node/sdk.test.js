// The official OpenAI, Anthropic and Ollama Node SDKs against one `shoal serve`.
// Exact numbers are facts of the default model (SmolLM2-135M-Instruct) under
// greedy decoding (temperature 0).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { Ollama } from 'ollama';

import { ledgerEntry, startServer } from './shoal-server.js';

const QUESTION = 'What is the capital of France? Answer in one sentence.';
const ANSWER = 'The capital of France is Paris.';
const ANSWER_TOKENS = 8; // seven text tokens plus the closing <|im_end|>
const PROMPT_TOKENS = 42; // QUESTION under the template's default system prompt
const STOP = 'Paris';
const STOPPED_TEXT = 'The capital of France is ';
const STOPPED_TOKENS = 6;
const CUT = 3;
const CUT_TEXT = 'The capital of';
const MAX = 24;
const RAW_PROMPT =
  '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' +
  `<|im_start|>user\n${QUESTION}<|im_end|>\n<|im_start|>assistant\n`;
const MESSAGES = [{ role: 'user', content: QUESTION }];

let server;
let openai;
let anthropic;
let model;

before(async () => {
  // Usage is compared across repeated identical requests: no prefix cache here.
  server = await startServer('--prefix-cache-mb', '0');
  model = server.model;
  openai = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'shoal-test', maxRetries: 0, timeout: 120_000 });
  anthropic = new Anthropic({ baseURL: server.url, apiKey: 'shoal-test', maxRetries: 0, timeout: 120_000 });
});

after(async () => {
  await server?.stop();
});

function chatUsage(u, prompt, completion) {
  assert.equal(u.prompt_tokens, prompt);
  assert.equal(u.completion_tokens, completion);
  assert.equal(u.total_tokens, prompt + completion);
}

async function countTokens(messages, system) {
  const body = { model, messages };
  if (system !== undefined) body.system = system;
  return (await anthropic.messages.countTokens(body)).input_tokens;
}

async function collect(stream) {
  const out = [];
  for await (const x of stream) out.push(x);
  return out;
}

describe('chat completions', () => {
  test('non-stream natural stop: exact usage, prompt equals count_tokens', async () => {
    const r = await openai.chat.completions.create({ model, messages: MESSAGES, max_tokens: MAX, temperature: 0 });
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].message.content, ANSWER);
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(await countTokens(MESSAGES), PROMPT_TOKENS);
    chatUsage(r.usage, PROMPT_TOKENS, ANSWER_TOKENS);
  });

  test('stream with include_usage: one usage chunk, last, no choices; equals non-stream', async () => {
    const plain = await openai.chat.completions.create({ model, messages: MESSAGES, max_tokens: MAX, temperature: 0 });
    const chunks = await collect(
      await openai.chat.completions.create({
        model, messages: MESSAGES, max_tokens: MAX, temperature: 0, stream: true,
        stream_options: { include_usage: true },
      }),
    );
    const withUsage = chunks.filter((c) => c.usage != null);
    assert.equal(withUsage.length, 1);
    const last = chunks.at(-1);
    assert.equal(last, withUsage[0]);
    assert.deepEqual(last.choices, []);
    assert.deepEqual(last.usage, plain.usage);
    chatUsage(last.usage, PROMPT_TOKENS, ANSWER_TOKENS);
    const text = chunks.flatMap((c) => c.choices.map((ch) => ch.delta.content ?? '')).join('');
    assert.equal(text, ANSWER);
    const finishes = chunks.flatMap((c) => c.choices.map((ch) => ch.finish_reason)).filter(Boolean);
    assert.deepEqual(finishes, ['stop']);
  });

  test('stream without include_usage: no chunk carries usage', async () => {
    const chunks = await collect(
      await openai.chat.completions.create({ model, messages: MESSAGES, max_tokens: CUT, temperature: 0, stream: true }),
    );
    assert.ok(chunks.every((c) => c.usage == null));
    assert.ok(chunks.every((c) => c.choices.length === 1));
    const finishes = chunks.flatMap((c) => c.choices.map((ch) => ch.finish_reason)).filter(Boolean);
    assert.deepEqual(finishes, ['length']);
  });

  test('stream helper with n=2 and a cut: per-choice text and finish, summed usage', async () => {
    const stream = openai.chat.completions.stream({
      model, messages: MESSAGES, max_tokens: CUT, temperature: 0, n: 2,
      stream_options: { include_usage: true },
    });
    const final = await stream.finalChatCompletion();
    assert.deepEqual(
      final.choices.map((c) => [c.index, c.message.content, c.finish_reason]),
      [[0, CUT_TEXT, 'length'], [1, CUT_TEXT, 'length']],
    );
    chatUsage(final.usage, PROMPT_TOKENS, 2 * CUT);
  });

  test('stop sequence', async () => {
    const r = await openai.chat.completions.create({
      model, messages: MESSAGES, max_tokens: MAX, temperature: 0, stop: [STOP],
    });
    assert.equal(r.choices[0].message.content, STOPPED_TEXT);
    assert.equal(r.choices[0].finish_reason, 'stop');
    chatUsage(r.usage, PROMPT_TOKENS, STOPPED_TOKENS);
  });

  test('closing a stream early is recorded as cancelled', async () => {
    const stream = await openai.chat.completions.create({
      model, messages: [{ role: 'user', content: 'Write the numbers from 1 to 500 separated by commas.' }],
      max_tokens: 4000, temperature: 0, stream: true,
    });
    let id;
    let deltas = 0;
    for await (const c of stream) {
      id = c.id;
      if (c.choices[0]?.delta?.content) deltas += 1;
      if (deltas >= 2) break; // leaving the loop aborts the request
    }
    const e = await ledgerEntry(server, id, (x) => x.finish_reasons[0] === 'cancelled');
    assert.deepEqual(e.finish_reasons, ['cancelled']);
    assert.ok(e.usage.completion_tokens >= 2 && e.usage.completion_tokens < 4000);
  });

  test('unknown model is NotFoundError', async () => {
    await assert.rejects(
      openai.chat.completions.create({ model: 'no-such-model', messages: MESSAGES, max_tokens: 1 }),
      (err) => err instanceof OpenAI.NotFoundError && err.status === 404 && err.code === 'model_not_found',
    );
  });
});

describe('anthropic messages', () => {
  test('stream: finalMessage usage and stop_reason, message_start input usage', async () => {
    const plain = await anthropic.messages.create({ model, messages: MESSAGES, max_tokens: MAX, temperature: 0 });
    const stream = anthropic.messages.stream({ model, messages: MESSAGES, max_tokens: MAX, temperature: 0 });
    const events = await collect(stream);
    const final = await stream.finalMessage();
    assert.equal(events[0].type, 'message_start');
    assert.equal(events.at(-1).type, 'message_stop');
    assert.equal(events[0].message.usage.input_tokens, final.usage.input_tokens);
    assert.equal(final.stop_reason, 'end_turn');
    assert.equal(final.stop_sequence, null);
    assert.equal(final.content[0].text, ANSWER);
    assert.equal(final.usage.input_tokens + final.usage.cache_read_input_tokens, PROMPT_TOKENS);
    assert.equal(final.usage.output_tokens, ANSWER_TOKENS);
    assert.deepEqual(final.usage, plain.usage);
    assert.equal(plain.stop_reason, 'end_turn');
  });

  test('stream cut by max_tokens', async () => {
    const final = await anthropic.messages
      .stream({ model, messages: MESSAGES, max_tokens: CUT, temperature: 0 })
      .finalMessage();
    assert.equal(final.stop_reason, 'max_tokens');
    assert.equal(final.content[0].text, CUT_TEXT);
    assert.equal(final.usage.output_tokens, CUT);
    assert.equal(final.usage.input_tokens, PROMPT_TOKENS);
  });

  test('non-stream stop_sequences: stop_sequence is the matched string', async () => {
    const m = await anthropic.messages.create({
      model, messages: MESSAGES, max_tokens: MAX, temperature: 0, stop_sequences: ['no such text', STOP],
    });
    assert.equal(m.stop_reason, 'stop_sequence');
    assert.equal(m.stop_sequence, STOP);
    assert.equal(m.content[0].text, STOPPED_TEXT);
    assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, PROMPT_TOKENS);
    assert.equal(m.usage.cache_creation_input_tokens, 0);
    assert.equal(m.usage.output_tokens, STOPPED_TOKENS);
  });

  test('system prompt forms agree with count_tokens', async () => {
    const system = 'You are terse.';
    const expected = await countTokens(MESSAGES, system);
    assert.notEqual(expected, PROMPT_TOKENS);
    for (const body of [
      { system, messages: MESSAGES },
      { system: [{ type: 'text', text: system }], messages: MESSAGES },
      { messages: [{ role: 'system', content: system }, ...MESSAGES] },
    ]) {
      const m = await anthropic.messages.create({ model, max_tokens: 1, temperature: 0, ...body });
      assert.equal(m.usage.input_tokens, expected);
      assert.equal(m.usage.output_tokens, 1);
      assert.equal(m.stop_reason, 'max_tokens');
    }
  });

  test('unknown model is NotFoundError', async () => {
    await assert.rejects(
      anthropic.messages.create({ model: 'no-such-model', messages: MESSAGES, max_tokens: 1 }),
      (err) => err instanceof Anthropic.NotFoundError && err.status === 404 && err.error?.error?.type === 'not_found_error',
    );
  });
});

describe('responses', () => {
  test('non-stream incomplete at max_output_tokens', async () => {
    const r = await openai.responses.create({ model, input: QUESTION, max_output_tokens: CUT, temperature: 0 });
    assert.equal(r.status, 'incomplete');
    assert.equal(r.incomplete_details.reason, 'max_output_tokens');
    assert.equal(r.output_text, CUT_TEXT);
    assert.equal(r.usage.input_tokens, PROMPT_TOKENS);
    assert.equal(r.usage.output_tokens, CUT);
    assert.equal(r.usage.total_tokens, PROMPT_TOKENS + CUT);
  });

  test('non-stream completed, then previous_response_id grows the input', async () => {
    const first = await openai.responses.create({ model, input: QUESTION, max_output_tokens: MAX, temperature: 0 });
    assert.equal(first.status, 'completed');
    assert.equal(first.output_text, ANSWER);
    assert.equal(first.usage.output_tokens, ANSWER_TOKENS);
    const second = await openai.responses.create({
      model, input: 'Thanks!', previous_response_id: first.id, max_output_tokens: 1, temperature: 0,
    });
    assert.ok(second.usage.input_tokens > first.usage.input_tokens);
    const convo = [...MESSAGES, { role: 'assistant', content: ANSWER }, { role: 'user', content: 'Thanks!' }];
    assert.equal(second.usage.input_tokens, await countTokens(convo));
  });
});

describe('completions', () => {
  test('raw ChatML prompt: natural stop with the same numbers as chat', async () => {
    const r = await openai.completions.create({ model, prompt: RAW_PROMPT, max_tokens: MAX, temperature: 0 });
    assert.equal(r.choices[0].text, ANSWER);
    assert.equal(r.choices[0].finish_reason, 'stop');
    chatUsage(r.usage, PROMPT_TOKENS, ANSWER_TOKENS);
  });

  test('stream with include_usage and n=2, cut by max_tokens', async () => {
    const plain = await openai.completions.create({ model, prompt: RAW_PROMPT, max_tokens: CUT, temperature: 0, n: 2 });
    const chunks = await collect(
      await openai.completions.create({
        model, prompt: RAW_PROMPT, max_tokens: CUT, temperature: 0, n: 2, stream: true,
        stream_options: { include_usage: true },
      }),
    );
    const last = chunks.at(-1);
    assert.deepEqual(last.choices, []);
    assert.equal(chunks.filter((c) => c.usage != null).length, 1);
    assert.deepEqual(last.usage, plain.usage);
    chatUsage(last.usage, PROMPT_TOKENS, 2 * CUT);
    const text = {};
    const finish = {};
    for (const c of chunks) {
      for (const ch of c.choices) {
        text[ch.index] = (text[ch.index] ?? '') + ch.text;
        if (ch.finish_reason) finish[ch.index] = ch.finish_reason;
      }
    }
    assert.deepEqual(text, { 0: CUT_TEXT, 1: CUT_TEXT });
    assert.deepEqual(finish, { 0: 'length', 1: 'length' });
  });
});

describe('tools', () => {
  const WEATHER = {
    name: 'get_weather',
    description: 'Current weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  };
  const ASK = [{ role: 'user', content: 'What is the weather in Paris?' }];

  test('openai stream helper: forced call, finalChatCompletion equals non-stream', async () => {
    const req = {
      model, messages: ASK, temperature: 0, max_tokens: 80,
      tools: [{ type: 'function', function: WEATHER }],
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
    };
    const plain = await openai.chat.completions.create(req);
    assert.equal(plain.choices[0].finish_reason, 'tool_calls');
    const call = plain.choices[0].message.tool_calls[0];
    assert.equal(call.function.name, 'get_weather');
    assert.equal(typeof JSON.parse(call.function.arguments).city, 'string');
    const stream = openai.chat.completions.stream({ ...req, stream_options: { include_usage: true } });
    const final = await stream.finalChatCompletion();
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
    const fcall = final.choices[0].message.tool_calls[0];
    assert.equal(fcall.function.name, call.function.name);
    assert.equal(fcall.function.arguments, call.function.arguments);
    assert.deepEqual(final.usage, plain.usage);
  });

  test('anthropic stream: tool_use block, input equals non-stream, stop_reason tool_use', async () => {
    const req = {
      model, max_tokens: 80, messages: ASK, temperature: 0,
      tools: [{ name: WEATHER.name, description: WEATHER.description, input_schema: WEATHER.parameters }],
      tool_choice: { type: 'tool', name: 'get_weather' },
    };
    const plain = await anthropic.messages.create(req);
    assert.equal(plain.stop_reason, 'tool_use');
    const use = plain.content.find((b) => b.type === 'tool_use');
    assert.equal(use.name, 'get_weather');
    const final = await anthropic.messages.stream(req).finalMessage();
    assert.equal(final.stop_reason, 'tool_use');
    assert.deepEqual(final.content.find((b) => b.type === 'tool_use').input, use.input);
    assert.deepEqual(final.usage.output_tokens, plain.usage.output_tokens);
  });
});

describe('ollama (official ollama-js client)', () => {
  const GREEDY = { temperature: 0, num_predict: MAX };
  const client = () => new Ollama({ host: server.url });

  test('list, show and ps name the model, as id and id:latest', async () => {
    const { models } = await client().list();
    assert.ok(models.some((m) => m.name === `${model}:latest`), JSON.stringify(models));
    const shown = await client().show({ model: `${model}:latest` });
    assert.ok(shown.capabilities.includes('tools') && shown.capabilities.includes('completion'));
    assert.equal(shown.model_info['general.architecture'], 'llama');
    const ps = await client().ps();
    assert.deepEqual(ps.models.map((m) => m.name), [`${model}:latest`]);
  });

  test('chat: exact counts, streamed and not', async () => {
    const r = await client().chat({ model, messages: MESSAGES, options: GREEDY });
    assert.equal(r.message.content, ANSWER);
    assert.deepEqual([r.prompt_eval_count, r.eval_count, r.done_reason], [PROMPT_TOKENS, ANSWER_TOKENS, 'stop']);
    let text = '';
    let last;
    for await (const part of await client().chat({ model, messages: MESSAGES, options: GREEDY, stream: true })) {
      text += part.message.content;
      last = part;
    }
    assert.equal(text, ANSWER);
    assert.deepEqual([last.done, last.prompt_eval_count, last.eval_count], [true, PROMPT_TOKENS, ANSWER_TOKENS]);
  });

  test('generate raw and cut, stop sequence, format', async () => {
    const raw = await client().generate({ model, prompt: RAW_PROMPT, raw: true, options: GREEDY });
    assert.equal(raw.response, ANSWER);
    const cut = await client().generate({ model, prompt: QUESTION, options: { temperature: 0, num_predict: CUT } });
    assert.deepEqual([cut.response, cut.eval_count, cut.done_reason], [CUT_TEXT, CUT, 'length']);
    const stopped = await client().chat({ model, messages: MESSAGES, options: { ...GREEDY, stop: [STOP] } });
    assert.deepEqual([stopped.message.content, stopped.eval_count], [STOPPED_TEXT, STOPPED_TOKENS]);
    const json = await client().chat({
      model, messages: [{ role: 'user', content: 'Which city is the capital of France? Answer as JSON.' }],
      format: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
      options: { temperature: 0, num_predict: 40 },
    });
    assert.equal(typeof JSON.parse(json.message.content).city, 'string');
  });

  test('errors: unknown model 404, thinking refused 400', async () => {
    await assert.rejects(client().chat({ model: 'no-such-model', messages: MESSAGES }), (e) =>
      e.status_code === 404 && /try pulling it first/.test(e.error));
    await assert.rejects(client().chat({ model, messages: MESSAGES, think: true }), (e) =>
      e.status_code === 400 && /does not support thinking/.test(e.error));
  });

  test('pull with progress from the hub fixture, chat on the pulled model, then delete', async () => {
    const PULLED = 'test/SmolLM2-GGUF';
    const events = [];
    for await (const e of await client().pull({ model: `hf.co/${PULLED}:Q4_1`, stream: true })) events.push(e);
    assert.equal(events[0].status, 'pulling manifest');
    assert.equal(events.at(-1).status, 'success');
    const progress = events.filter((e) => e.digest);
    assert.ok(progress.length > 0 && progress.every((e) => e.digest.startsWith('sha256:') && e.total > 0));
    assert.equal(progress.at(-1).completed, progress.at(-1).total);
    const pulled = (await client().list()).models.map((m) => m.name).find((n) => n.startsWith(`${PULLED}/`));
    assert.ok(pulled?.endsWith('.gguf:latest'), String(pulled));
    const r = await client().chat({ model: pulled, messages: MESSAGES, options: GREEDY, keep_alive: 0 });
    assert.deepEqual([r.message.content, r.done_reason], [ANSWER, 'stop']);
    assert.equal((await client().delete({ model: pulled })).status, 'success');
    assert.ok(!(await client().list()).models.some((m) => m.name === pulled));
    await assert.rejects(client().delete({ model: pulled }), (e) => e.status_code === 404);
  });
});
