// /v1/chat/completions through the OpenAI SDK. The demo model has random weights, so these
// assert shapes, types, counts and finish reasons, never the text.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, user, FINISH, MODEL } from './helpers.mjs';

const oa = client();

function checkUsage(u, promptTokens) {
  assert.equal(typeof u.prompt_tokens, 'number');
  assert.ok(u.prompt_tokens > 0);
  if (promptTokens !== undefined) assert.equal(u.prompt_tokens, promptTokens);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  assert.equal(typeof u.prompt_tokens_details?.cached_tokens, 'number');
  assert.ok(u.prompt_tokens_details.cached_tokens >= 0 && u.prompt_tokens_details.cached_tokens < u.prompt_tokens);
}

async function collect(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

test('non-streaming chat has content, reasoning_content, finish_reason and usage', async () => {
  const r = await oa.chat.completions.create({ model: MODEL, messages: user('Say hi.'), max_tokens: 12 });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, MODEL);
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.index, 0);
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.equal(typeof c.message.reasoning_content, 'string');
  assert.ok(FINISH.includes(c.finish_reason), c.finish_reason);
  checkUsage(r.usage);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 12);
});

test('streaming chat: role first, string deltas, one finish_reason, no usage unless asked', async () => {
  const chunks = await collect(await oa.chat.completions.create({
    model: MODEL, messages: user('Stream please.'), max_tokens: 10, stream: true,
  }));
  assert.ok(chunks.length >= 2);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const finishes = [];
  for (const ch of chunks) {
    assert.equal(ch.object, 'chat.completion.chunk');
    assert.equal(ch.id, chunks[0].id);
    assert.equal(ch.choices.length, 1, 'no usage chunk without stream_options');
    const d = ch.choices[0].delta;
    for (const k of ['content', 'reasoning_content']) if (k in d) assert.equal(typeof d[k], 'string');
    if (ch.choices[0].finish_reason) finishes.push(ch.choices[0].finish_reason);
  }
  assert.equal(finishes.length, 1);
  assert.ok(FINISH.includes(finishes[0]));
});

test('stream_options.include_usage sends one usage chunk with empty choices last', async () => {
  const chunks = await collect(await oa.chat.completions.create({
    model: MODEL, messages: user('Count tokens.'), max_tokens: 6, stream: true, stream_options: { include_usage: true },
  }));
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  checkUsage(last.usage);
  assert.ok(last.usage.completion_tokens >= 1 && last.usage.completion_tokens <= 6);
  assert.equal(chunks.filter((c) => c.usage).length, 1);
});

test('stream_options.continuous_usage_stats (vLLM): every chunk carries the counts so far', async () => {
  const chunks = await collect(await oa.chat.completions.create({
    model: MODEL, messages: user('Count tokens.'), max_tokens: 6, stream: true,
    stream_options: { include_usage: true, continuous_usage_stats: true },
  }));
  let prev = 0;
  for (const c of chunks) {
    checkUsage(c.usage);
    assert.ok(c.usage.completion_tokens >= prev, JSON.stringify(c.usage));
    prev = c.usage.completion_tokens;
  }
  assert.deepEqual(chunks.at(-1).choices, []);
  assert.equal(chunks.at(-2).usage.completion_tokens, chunks.at(-1).usage.completion_tokens);
  // Without include_usage it asks for nothing (as vLLM); a non-boolean is a 400 naming it.
  const plain = await collect(await oa.chat.completions.create({
    model: MODEL, messages: user('Count tokens.'), max_tokens: 3, stream: true, stream_options: { continuous_usage_stats: true },
  }));
  assert.equal(plain.filter((c) => c.usage).length, 0);
  const bad = await oa.chat.completions.create({ model: MODEL, messages: user('x'), max_tokens: 2, stream: true,
    stream_options: { include_usage: true, continuous_usage_stats: 'yes' } }).catch((e) => e);
  assert.equal(bad.status, 400);
  assert.equal(bad.param, 'stream_options.continuous_usage_stats');
});

test('a repeated prompt reports cached_tokens from the prefix cache', async () => {
  const messages = [{ role: 'system', content: 'You are a test. '.repeat(20) }, ...user('Repeat me exactly.')];
  const a = await oa.chat.completions.create({ model: MODEL, messages, max_tokens: 2, temperature: 0 });
  const b = await oa.chat.completions.create({ model: MODEL, messages, max_tokens: 2, temperature: 0 });
  checkUsage(b.usage, a.usage.prompt_tokens);
  assert.ok(b.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(b.usage));
  assert.ok(b.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens_details.cached_tokens);
  // Same tokens at temperature 0 with and without the cache.
  assert.deepEqual(b.choices[0].message, a.choices[0].message);
  const s = await collect(await oa.chat.completions.create({
    model: MODEL, messages, max_tokens: 2, temperature: 0, stream: true, stream_options: { include_usage: true },
  }));
  assert.ok(s.at(-1).usage.prompt_tokens_details.cached_tokens > 0);
});

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];

test('tool definitions are accepted, with tool_choice auto and none', async () => {
  for (const tool_choice of ['auto', 'none']) {
    const r = await oa.chat.completions.create({ model: MODEL, messages: user('Weather in Paris?'), tools, tool_choice, max_tokens: 8 });
    const c = r.choices[0];
    assert.ok(FINISH.includes(c.finish_reason));
    if (c.message.tool_calls) {
      for (const tc of c.message.tool_calls) {
        assert.equal(tc.type, 'function');
        assert.equal(typeof tc.function.name, 'string');
        assert.equal(typeof tc.function.arguments, 'string');
      }
    }
  }
});

// A named tool_choice starts the call in the prompt; its arguments are held to the function's parameters
// (the tiny random model's text is JSON that follows them whenever the call ends), and a strict
// function's unreadable schema is a 400 naming it.
test('a forced call\'s arguments follow its parameters', async () => {
  const strictTools = [{ type: 'function', function: { name: 'get_weather', strict: true, parameters: { type: 'object',
    properties: { city: { type: 'string' }, unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'], additionalProperties: false } } }];
  let ended = 0;
  for (const seed of [1, 2, 3, 4, 5, 6]) {
    const r = await oa.chat.completions.create({ model: MODEL, messages: user('Weather in Paris?'), tools: strictTools,
      tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 48, temperature: 1, seed });
    const c = r.choices[0];
    if (c.finish_reason !== 'tool_calls') continue;
    ended += 1;
    const args = JSON.parse(c.message.tool_calls[0].function.arguments);
    assert.deepEqual(Object.keys(args).sort(), ['city', 'unit']);
    assert.equal(typeof args.city, 'string');
    assert.ok(['c', 'f'].includes(args.unit));
  }
  assert.ok(ended > 0, 'no call ended within max_tokens');
  const bad = [{ type: 'function', function: { name: 'f', strict: true, parameters: { type: 'obj' } } }];
  const err = await oa.chat.completions.create({ model: MODEL, messages: user('x'), tools: bad, max_tokens: 4 }).then(() => null, (e) => e);
  assert.equal(err?.status, 400);
  assert.equal(err.error.param, 'tools[0].function.parameters');
});

test('response_format text, json_object and json_schema are accepted', async () => {
  for (const response_format of [{ type: 'text' }, { type: 'json_object' },
    { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: { type: 'object', properties: { name: { type: 'string' } } } } }]) {
    const r = await oa.chat.completions.create({ model: MODEL, messages: user('Hi'), response_format, max_tokens: 8 });
    assert.ok(FINISH.includes(r.choices[0].finish_reason));
  }
});

test('tool-call round trip history (assistant tool_calls + tool message) is accepted', async () => {
  const messages = [
    ...user('Weather in Paris?'),
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 18}' },
  ];
  const r = await oa.chat.completions.create({ model: MODEL, messages, tools, max_tokens: 8 });
  assert.ok(FINISH.includes(r.choices[0].finish_reason));
  const s = await collect(await oa.chat.completions.create({ model: MODEL, messages, tools, max_tokens: 4, stream: true }));
  assert.ok(s.some((c) => c.choices[0]?.finish_reason));
});

test('logprobs with top_logprobs have the OpenAI shape', async () => {
  const r = await oa.chat.completions.create({ model: MODEL, messages: user('x'), max_tokens: 5, logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert.ok(Array.isArray(lp) && lp.length >= 1 && lp.length <= 5);
  for (const e of lp) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 3);
    for (const t of e.top_logprobs) { assert.equal(typeof t.token, 'string'); assert.ok(t.logprob <= 0); }
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[2].logprob);
  }
  const plain = await oa.chat.completions.create({ model: MODEL, messages: user('x'), max_tokens: 2 });
  assert.equal(plain.choices[0].logprobs, null);
});

test('stop strings are accepted and never appear in the content', async () => {
  const stop = ['e', ' the', '\n'];
  const r = await oa.chat.completions.create({ model: MODEL, messages: user('Write a sentence.'), max_tokens: 16, stop });
  for (const s of stop) assert.ok(!r.choices[0].message.content.includes(s));
  assert.ok(FINISH.includes(r.choices[0].finish_reason));
  const t = await oa.chat.completions.create({ model: MODEL, messages: user('x'), max_tokens: 4, stop_token_ids: [13, 200] });
  assert.ok(FINISH.includes(t.choices[0].finish_reason));
});

test('n=2 returns two indexed choices, in both modes', async () => {
  const r = await oa.chat.completions.create({ model: MODEL, messages: user('Two answers.'), max_tokens: 6, n: 2 });
  assert.deepEqual(r.choices.map((c) => c.index).sort(), [0, 1]);
  assert.ok(r.usage.completion_tokens >= 2 && r.usage.completion_tokens <= 12);
  const chunks = await collect(await oa.chat.completions.create({ model: MODEL, messages: user('Two answers.'), max_tokens: 4, n: 2, stream: true }));
  const finished = new Set(chunks.filter((c) => c.choices[0]?.finish_reason).map((c) => c.choices[0].index));
  assert.deepEqual([...finished].sort(), [0, 1]);
});

test('max_tokens ends with finish_reason length (max_completion_tokens too)', async () => {
  // A random-weight model could still sample a stop token first: then it must be fewer tokens.
  for (const p of [{ max_tokens: 3 }, { max_completion_tokens: 3 }]) {
    const r = await oa.chat.completions.create({ model: MODEL, messages: user('Go on and on.'), temperature: 0, ...p });
    const c = r.choices[0];
    if (c.finish_reason === 'length') assert.equal(r.usage.completion_tokens, 3);
    else assert.ok(r.usage.completion_tokens < 3);
  }
});
