// Bad inputs (reliability.md table A), authentication and unknown models: every one gets a clear
// OpenAI error body, and the SDK raises the matching error class.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { client, raw, user, MODEL, URL_BASE } from './helpers.mjs';

const oa = client();
const chat = (extra) => ({ model: MODEL, messages: user('hi'), max_tokens: 2, ...extra });
const cmpl = (extra) => ({ model: MODEL, prompt: 'hi', max_tokens: 2, ...extra });

// [table A row, endpoint, body, param the error must name (prefix match)]
const BAD = [
  ['4 messages missing', 'chat', { model: MODEL, max_tokens: 2 }, 'messages'],
  ['4 messages null', 'chat', chat({ messages: null }), 'messages'],
  ['4 messages string', 'chat', chat({ messages: 'hi' }), 'messages'],
  ['4 messages [123]', 'chat', chat({ messages: [123] }), 'messages[0]'],
  ['4 messages [{}]', 'chat', chat({ messages: [{}] }), 'messages[0]'],
  ['5 role 123', 'chat', chat({ messages: [{ role: 123, content: 'x' }] }), 'messages[0].role'],
  ['5 content 123', 'chat', chat({ messages: [{ role: 'user', content: 123 }] }), 'messages[0].content'],
  ['5 trailing {}', 'chat', chat({ messages: [...user('x'), {}] }), 'messages[1]'],
  ['7 messages []', 'chat', chat({ messages: [] }), 'messages'],
  ['7 prompt ""', 'cmpl', cmpl({ prompt: '' }), 'prompt'],
  ['8 token id out of vocab', 'cmpl', cmpl({ prompt: [999999] }), 'prompt'],
  ['9 max_tokens 0', 'chat', chat({ max_tokens: 0 }), 'max_tokens'],
  ['9 max_tokens -5', 'cmpl', cmpl({ max_tokens: -5 }), 'max_tokens'],
  ['10 max_tokens 1e9', 'chat', chat({ max_tokens: 1e9 }), 'max_tokens'],
  ['13 temperature -1', 'chat', chat({ temperature: -1 }), 'temperature'],
  ['13 temperature 3', 'cmpl', cmpl({ temperature: 3 }), 'temperature'],
  ['15 top_p 0', 'chat', chat({ top_p: 0 }), 'top_p'],
  ['15 top_p 1.5', 'chat', chat({ top_p: 1.5 }), 'top_p'],
  ['16 top_k -2', 'chat', chat({ top_k: -2 }), 'top_k'],
  ['16 top_k 2.5', 'chat', chat({ top_k: 2.5 }), 'top_k'],
  ['17 min_p 1.5', 'chat', chat({ min_p: 1.5 }), 'min_p'],
  ['18 presence_penalty 3', 'chat', chat({ presence_penalty: 3 }), 'presence_penalty'],
  ['18 repetition_penalty 0', 'cmpl', cmpl({ repetition_penalty: 0 }), 'repetition_penalty'],
  ['18 frequency_penalty "1"', 'chat', chat({ frequency_penalty: '1' }), 'frequency_penalty'],
  ['19 n 0', 'chat', chat({ n: 0 }), 'n'],
  ['19 n "2"', 'chat', chat({ n: '2' }), 'n'],
  ['19 n 1e6', 'chat', chat({ n: 1000000 }), 'n'],
  ['21 best_of 1000', 'cmpl', cmpl({ best_of: 1000 }), 'best_of'],
  ['22 top_logprobs 1e6', 'chat', chat({ logprobs: true, top_logprobs: 1000000 }), 'top_logprobs'],
  ['22 completions logprobs -1', 'cmpl', cmpl({ logprobs: -1 }), 'logprobs'],
  ['23 stop [""]', 'chat', chat({ stop: [''] }), 'stop'],
  ['23 1000 stop strings', 'chat', chat({ stop: Array.from({ length: 1000 }, (_, i) => `s${i}`) }), 'stop'],
  ['24 stop_token_ids ["a"]', 'chat', chat({ stop_token_ids: ['a'] }), 'stop_token_ids'],
  ['24 stop_token_ids out of vocab', 'cmpl', cmpl({ stop_token_ids: [999999] }), 'stop_token_ids'],
  ['25 min_tokens > max_tokens', 'chat', chat({ min_tokens: 50, max_tokens: 10 }), 'min_tokens'],
  ['echo "yes" (completions)', 'cmpl', cmpl({ echo: 'yes' }), 'echo'],
  ['prompt_logprobs -1', 'cmpl', cmpl({ prompt_logprobs: -1 }), 'prompt_logprobs'],
  ['prompt_logprobs 21', 'chat', chat({ prompt_logprobs: 21 }), 'prompt_logprobs'],
  ['suffix (completions)', 'cmpl', cmpl({ suffix: 'end' }), 'suffix'],
  ['26 logit_bias', 'chat', chat({ logit_bias: { abc: 5 } }), 'logit_bias'],
  ['26 logit_bias out of vocab', 'cmpl', cmpl({ logit_bias: { 999999: 5 } }), 'logit_bias'],
  ['27 seed 2^70', 'chat', chat({ seed: 2 ** 70 }), 'seed'],
  ['28 response_format', 'chat', chat({ response_format: { type: 123 } }), 'response_format'],
  ['28 response_format json_schema without a schema', 'chat',
    chat({ response_format: { type: 'json_schema', json_schema: { name: 'x' } } }), 'response_format.json_schema.schema'],
  ['30 tools bad type', 'chat', chat({ tools: [{ type: 'nope', function: { name: 'f' } }] }), 'tools[0]'],
  ['30 tool_choice names an unknown function', 'chat',
    chat({ tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: { type: 'function', function: { name: 'g' } } }),
    'tool_choice'],
  ['41 reasoning_effort extreme', 'chat', chat({ reasoning_effort: 'extreme' }), 'reasoning_effort'],
];

for (const [name, ep, body, param] of BAD) {
  test(`400 naming the param: ${name}`, async () => {
    const call = ep === 'chat' ? oa.chat.completions.create(body) : oa.completions.create(body);
    const err = await call.then(() => null, (e) => e);
    assert.ok(err instanceof OpenAI.BadRequestError, `expected BadRequestError, got ${err}`);
    assert.equal(err.status, 400);
    assert.equal(err.type, 'invalid_request_error');
    assert.equal(typeof err.error.message, 'string');
    assert.ok(err.error.message.length > 0);
    assert.ok(typeof err.param === 'string' && err.param.startsWith(param), `param ${err.param}, expected ${param}`);
  });
}

test('400 for bodies the SDK cannot send: bad JSON, non-objects, wrong content type', async () => {
  const cases = [
    { body: 'this is not json{{{' },
    { body: '[1,2]' }, { body: '42' }, { body: 'null' },
    { body: '{"model":"x","temperature":NaN}' },
    { body: JSON.stringify(chat({})), headers: { 'Content-Type': 'application/x-www-form-urlencoded' } },
  ];
  for (const c of cases) {
    const r = await raw('/v1/chat/completions', c);
    assert.equal(r.status, 400, c.body);
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.equal(r.json.error.code, 400);
  }
});

test('the context limit error names both numbers', async () => {
  const err = await oa.chat.completions.create(chat({ max_tokens: 1e9 })).catch((e) => e);
  assert.match(err.message, /maximum context length is \d+ tokens/);
});

test('413 for a body over 2 MiB', async () => {
  const r = await raw('/v1/chat/completions', { body: JSON.stringify(chat({ messages: user('x'.repeat(3 << 20)) })) });
  assert.equal(r.status, 413);
  assert.equal(r.json.error.type, 'invalid_request_error');
  assert.match(r.json.error.message, /over \d+ bytes/);
});

test('404 in the API error shape for an unknown route', async () => {
  for (const [path, method] of [['/v1/embeddings', 'POST'], ['/nope', 'GET']]) {
    const r = await raw(path, method === 'GET' ? { method } : { body: '{}' });
    assert.equal(r.status, 404, path);
    assert.equal(r.json.error.type, 'not_found_error');
    assert.ok(r.json.error.message.includes(path), r.json.error.message);
  }
});

test('401 for a wrong or missing API key', async () => {
  const err = await client({ apiKey: 'wrong-key' }).chat.completions.create(chat({})).catch((e) => e);
  assert.ok(err instanceof OpenAI.AuthenticationError, `${err}`);
  assert.equal(err.status, 401);
  assert.equal(err.type, 'authentication_error');
  const missing = await raw('/v1/chat/completions', { body: JSON.stringify(chat({})), key: '' });
  assert.equal(missing.status, 401);
  assert.equal(missing.json.error.type, 'authentication_error');
  assert.equal((await raw('/v1/models', { method: 'GET', key: '' })).status, 401);
  assert.equal((await raw(`/v1/models/${MODEL}`, { method: 'GET', key: '' })).status, 401);
  assert.equal((await raw('/health', { method: 'GET', key: '' })).status, 200);
});

test('404 for an unknown model', async () => {
  for (const call of [() => oa.chat.completions.create(chat({ model: 'nope' })), () => oa.completions.create(cmpl({ model: 'nope' }))]) {
    const err = await call().catch((e) => e);
    assert.ok(err instanceof OpenAI.NotFoundError, `${err}`);
    assert.equal(err.status, 404);
    assert.equal(err.param, 'model');
    assert.match(err.message, /does not exist/);
  }
});

test('the server still answers after all of that', async () => {
  const r = await oa.chat.completions.create(chat({}));
  assert.equal(r.choices.length, 1);
  assert.ok(URL_BASE);
});
