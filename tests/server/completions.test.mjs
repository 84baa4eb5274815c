// /v1/completions, /v1/models and the small probes (/version, /ping) through the OpenAI SDK.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { client, raw, startServer, user, MODEL } from './helpers.mjs';

const oa = client();

test('completions with a text prompt', async () => {
  const r = await oa.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 5, temperature: 0 });
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

test('completions with token ids, logprobs and streaming usage', async () => {
  const prompt = [1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 11000, 12000, 13000, 14000, 15000, 16000, 17000, 18000];
  const r = await oa.completions.create({ model: MODEL, prompt, max_tokens: 4, logprobs: 2, temperature: 0 });
  assert.equal(r.usage.prompt_tokens, prompt.length);
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, lp.token_logprobs.length);
  assert.equal(lp.top_logprobs.length, lp.tokens.length);
  for (const t of lp.top_logprobs) assert.ok(Object.keys(t).length >= 1 && Object.keys(t).length <= 2);
  const chunks = [];
  for await (const c of await oa.completions.create({
    model: MODEL, prompt, max_tokens: 4, temperature: 0, stream: true, stream_options: { include_usage: true },
  })) chunks.push(c);
  const text = chunks.filter((c) => c.choices.length).map((c) => c.choices[0].text).join('');
  assert.equal(text, r.choices[0].text);
  const usage = chunks.at(-1).usage;
  assert.equal(usage.prompt_tokens, prompt.length);
  assert.equal(usage.prompt_tokens_details.cached_tokens, 16);  // one full 16-token block was cached
});

test('a batch of prompts (OpenAI): each prompt\'s n choices in order, usage over all of them', async () => {
  const a = 'Once upon a time', b = [3000, 3001, 3002];
  const base = { model: MODEL, max_tokens: 4, temperature: 0 };
  const one_a = await oa.completions.create({ ...base, prompt: a });
  const one_b = await oa.completions.create({ ...base, prompt: b });
  const r = await oa.completions.create({ ...base, prompt: [a, a], n: 2 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
  for (const c of r.choices) assert.equal(c.text, one_a.choices[0].text);
  assert.equal(r.usage.prompt_tokens, 2 * one_a.usage.prompt_tokens);
  assert.equal(r.usage.completion_tokens, r.choices.length * 4);
  const ids = await oa.completions.create({ ...base, prompt: [b, [3000, 3001, 3002]] });
  assert.deepEqual(ids.choices.map((c) => c.text), [one_b.choices[0].text, one_b.choices[0].text]);
  // Streamed: every choice index appears and ends.
  const seen = new Map();
  const stream = await oa.completions.create({ ...base, prompt: [a, 'Another prompt'], stream: true });
  for await (const ch of stream)
    for (const c of ch.choices) {
      seen.set(c.index, (seen.get(c.index) ?? '') + c.text);
      if (c.finish_reason) seen.set(`end${c.index}`, c.finish_reason);
    }
  assert.equal(seen.get(0), one_a.choices[0].text);
  assert.ok(seen.has('end0') && seen.has('end1'), JSON.stringify([...seen]));
});

test('a batch of prompts: bad members and too many choices are a 400 naming prompt', async () => {
  for (const prompt of [[], [[]], ['a', 5], ['a', ''], [[1, 'x']], Array(65).fill('a')]) {
    const err = await oa.completions.create({ model: MODEL, prompt, max_tokens: 2 }).catch((e) => e);
    assert.equal(err.status, 400, JSON.stringify(prompt).slice(0, 40));
    assert.equal(err.param, 'prompt');
  }
  const err = await oa.completions.create({ model: MODEL, prompt: Array(9).fill('a'), n: 8, max_tokens: 2 }).catch((e) => e);
  assert.equal(err.status, 400);
  assert.match(err.message, /72 choices/);
});

test('completions n=2 and stop', async () => {
  const r = await oa.completions.create({ model: MODEL, prompt: 'abc', max_tokens: 4, n: 2, stop: 'zzz' });
  assert.deepEqual(r.choices.map((c) => c.index).sort(), [0, 1]);
});

test('/v1/models lists the served model', async () => {
  const models = [];
  for await (const m of oa.models.list()) models.push(m);
  assert.equal(models.length, 1);
  assert.equal(models[0].id, MODEL);
  assert.equal(models[0].object, 'model');
  assert.equal(typeof models[0].max_model_len, 'number');
});

test('/v1/models/{id} retrieves the served model; another id is a 404', async () => {
  const m = await oa.models.retrieve(MODEL);
  assert.equal(m.id, MODEL);
  assert.equal(m.object, 'model');
  assert.equal(typeof m.max_model_len, 'number');
  const err = await oa.models.retrieve('nope').catch((e) => e);
  assert.ok(err instanceof OpenAI.NotFoundError, `${err}`);
  assert.equal(err.param, 'model');
  assert.match(err.message, /`nope` does not exist/);
});

test('several --served-model-name names (vLLM): all listed and accepted, the first in responses; a slash as sent or escaped', async () => {
  const name = 'openai/gpt-oss-demo';
  const srv = await startServer(['--served-model-name', name, 'demo-alias']);
  try {
    const oa2 = client({ baseURL: `${srv.base}/v1` });
    const listed = [];
    for await (const m of oa2.models.list()) listed.push(m.id);
    assert.deepEqual(listed, [name, 'demo-alias']);
    assert.equal((await oa2.models.retrieve(name)).id, name);
    assert.equal((await oa2.models.retrieve('demo-alias')).id, 'demo-alias');
    const escaped = await raw(`/v1/models/${encodeURIComponent(name)}`, { method: 'GET', base: srv.base });
    assert.equal(escaped.status, 200, escaped.text);
    assert.equal(escaped.json.id, name);
    const r = await oa2.completions.create({ model: 'demo-alias', prompt: 'abc', max_tokens: 2 });
    assert.equal(r.model, name);
    const err = await oa2.completions.create({ model: MODEL, prompt: 'abc', max_tokens: 2 }).catch((e) => e);
    assert.equal(err.status, 404);
  } finally {
    srv.proc.kill('SIGKILL');
  }
});

test('/tokenize and /detokenize round-trip; return_token_strs (vLLM) gives the vocabulary\'s spelling', async () => {
  const t = await raw('/tokenize', { body: JSON.stringify({ prompt: 'hello world', return_token_strs: true }) });
  assert.equal(t.status, 200, t.text);
  assert.equal(t.json.count, t.json.tokens.length);
  assert.equal(typeof t.json.max_model_len, 'number');
  assert.deepEqual(t.json.token_strs, ['hello', '\u0120world']);  // o200k: two tokens, the space as U+0120
  const d = await raw('/detokenize', { body: JSON.stringify({ tokens: t.json.tokens }) });
  assert.equal(d.json.prompt, 'hello world');
  const plain = await raw('/tokenize', { body: JSON.stringify({ prompt: 'hello world' }) });
  assert.equal(plain.json.token_strs, undefined);
  const chat = await raw('/tokenize', { body: JSON.stringify({ messages: user('hi'), return_token_strs: true }) });
  assert.ok(chat.json.token_strs.includes('<|start|>'), JSON.stringify(chat.json.token_strs));
  const bad = await raw('/tokenize', { body: JSON.stringify({ prompt: 'x', return_token_strs: 'yes' }) });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.param, 'return_token_strs');
});

test('/version, and /ping answered as /health (GET and POST)', async () => {
  const v = await raw('/version', { method: 'GET', key: '' });
  assert.equal(v.status, 200);
  assert.match(v.json.version, /^\d+\.\d+\.\d+/);
  for (const method of ['GET', 'POST']) {
    const r = await raw('/ping', method === 'GET' ? { method, key: '' } : { body: '', key: '' });
    assert.equal(r.status, 200, method);
    assert.equal(r.json.status, 'ok');
  }
});

// The greedy completion of `prompt` and the id of its token `at` (null when that token's text does not
// tokenize back to one id).
async function greedy_token(prompt, max_tokens, at) {
  const r = await oa.completions.create({ model: MODEL, prompt, max_tokens, temperature: 0, logprobs: 0 });
  const text = r.choices[0].logprobs.tokens[at];
  const tok = await raw('/tokenize', { body: JSON.stringify({ prompt: text }) });
  return { r, text, ids: tok.json?.tokens?.length === 1 ? tok.json.tokens : null };
}

test('stop_token_ids end generation before the stop token (finish_reason stop)', async (t) => {
  const prompt = [3000, 3001, 3002, 3003];
  const { r, text: second, ids } = await greedy_token(prompt, 3, 1);
  if (!ids) return t.skip(`token ${JSON.stringify(second)} does not round-trip`);
  const s = await oa.completions.create({ model: MODEL, prompt, max_tokens: 3, temperature: 0, stop_token_ids: ids });
  assert.equal(s.choices[0].finish_reason, 'stop');
  assert.ok(r.choices[0].text.startsWith(s.choices[0].text));
  assert.equal(s.usage.completion_tokens, 2);
});

test('include_stop_str_in_output (vLLM) keeps the matched stop string and the stop token', async (t) => {
  const prompt = [3000, 3001, 3002, 3003];
  const { r, text: second, ids } = await greedy_token(prompt, 3, 1);
  const first = r.choices[0].logprobs.tokens[0];
  const base = { model: MODEL, prompt, max_tokens: 3, temperature: 0, logprobs: 0 };
  if (first.length > 0) {  // the stop string matches at the start: nothing, or just the string
    const cut = await oa.completions.create({ ...base, stop: [first] });
    assert.equal(cut.choices[0].text, '');
    const kept = await oa.completions.create({ ...base, stop: [first], include_stop_str_in_output: true });
    assert.equal(kept.choices[0].text, first);
    assert.equal(kept.choices[0].finish_reason, 'stop');
  }
  if (!ids) return t.skip(`token ${JSON.stringify(second)} does not round-trip`);
  const s = await oa.completions.create({ ...base, stop_token_ids: ids, include_stop_str_in_output: true });
  assert.equal(s.choices[0].finish_reason, 'stop');
  assert.equal(s.usage.completion_tokens, 2);
  assert.deepEqual(s.choices[0].logprobs.tokens, [first, second]);
  assert.equal(s.choices[0].text, first + second);
  const bad = await oa.completions.create({ ...base, include_stop_str_in_output: 1 }).catch((e) => e);
  assert.equal(bad.status, 400);
  assert.equal(bad.param, 'include_stop_str_in_output');
});

test('logit_bias: +100 forces a token, -100 moves the greedy pick away', async (t) => {
  const prompt = [3000, 3001, 3002, 3003];
  const { text: first, ids } = await greedy_token(prompt, 3, 0);
  if (!ids) return t.skip(`token ${JSON.stringify(first)} does not round-trip`);
  const base = { model: MODEL, prompt, max_tokens: 3, temperature: 0, logprobs: 0 };
  const forced = ids[0] === 1234 ? 1235 : 1234;
  const all = await oa.completions.create({ ...base, logit_bias: { [forced]: 100 } });
  const word = (await raw('/detokenize', { body: JSON.stringify({ tokens: [forced] }) })).json.prompt;
  assert.deepEqual(all.choices[0].logprobs.tokens, [word, word, word]);
  const away = await oa.completions.create({ ...base, logit_bias: { [ids[0]]: -100 } });
  assert.notEqual(away.choices[0].logprobs.tokens[0], first);
  const chat = await oa.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2,
    temperature: 0, logit_bias: { [forced]: 100 } });
  assert.equal(chat.usage.completion_tokens, 2);
});

test('penalties: repetition_penalty covers the prompt; presence and frequency are accepted', async () => {
  const prompt = [3000, 3001, 3002, 3003];
  const base = { model: MODEL, prompt, max_tokens: 3, temperature: 0, logprobs: 0, logit_bias: { 3000: 50 } };
  const word = (await raw('/detokenize', { body: JSON.stringify({ tokens: [3000] }) })).json.prompt;
  const free = await oa.completions.create(base);
  assert.deepEqual(free.choices[0].logprobs.tokens, [word, word, word]);
  const rep = await oa.completions.create({ ...base, repetition_penalty: 1e6 });
  assert.ok(!rep.choices[0].logprobs.tokens.includes(word), JSON.stringify(rep.choices[0].logprobs.tokens));
  const pen = await oa.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 3,
    presence_penalty: 1.5, frequency_penalty: -0.5 });
  assert.equal(pen.usage.completion_tokens, 3);
});

test('min_tokens: no stop token or stop string ends the text before it', async (t) => {
  const prompt = [3000, 3001, 3002, 3003];
  const { text: first, ids } = await greedy_token(prompt, 4, 0);
  if (!ids) return t.skip(`token ${JSON.stringify(first)} does not round-trip`);
  const base = { model: MODEL, prompt, max_tokens: 4, temperature: 0, logprobs: 0 };
  const stopped = await oa.completions.create({ ...base, stop_token_ids: ids });
  assert.equal(stopped.usage.completion_tokens, 1);
  assert.equal(stopped.choices[0].finish_reason, 'stop');
  const held = await oa.completions.create({ ...base, stop_token_ids: ids, min_tokens: 3 });
  assert.ok(held.usage.completion_tokens >= 3, `${held.usage.completion_tokens} tokens`);
  assert.notEqual(held.choices[0].logprobs.tokens[0], first);  // the greedy pick was masked
  if (first.trim().length > 0) {
    const text = await oa.completions.create({ ...base, stop: [first], min_tokens: 4 });
    assert.equal(text.usage.completion_tokens, 4);
  }
});

// response_format json_object holds a raw completion to JSON from its first token: the tiny random model's
// text begins an object, and one that stops is a whole object.
test('response_format json_object: the completion is JSON', async () => {
  for (const seed of [1, 2, 3]) {
    const r = await oa.completions.create({ model: MODEL, prompt: 'Data:', max_tokens: 24, temperature: 1, seed,
      response_format: { type: 'json_object' } });
    const c = r.choices[0];
    assert.match(c.text, /^\s*\{/);
    if (c.finish_reason === 'stop') assert.equal(typeof JSON.parse(c.text), 'object');
  }
});

// vLLM's guided_choice (and structured_outputs.choice): the text is one of the strings, then it stops;
// guided_json as a schema's text holds it like json_schema; guided_regex matches its pattern whole.
test('guided_choice, guided_json and guided_regex hold a completion', async () => {
  const choices = ['yes', 'no', 'not sure'];
  for (const seed of [1, 2, 3, 4]) {
    for (const extra of [{ guided_choice: choices }, { structured_outputs: { choice: choices } }]) {
      const r = await oa.completions.create({ model: MODEL, prompt: 'Answer:', max_tokens: 16, temperature: 1, seed, ...extra });
      assert.ok(choices.includes(r.choices[0].text), JSON.stringify(r.choices[0]));
      assert.equal(r.choices[0].finish_reason, 'stop');
    }
  }
  const r = await oa.completions.create({ model: MODEL, prompt: 'n:', max_tokens: 24, temperature: 1, seed: 5,
    guided_json: JSON.stringify({ type: 'integer' }) });
  assert.match(r.choices[0].text, /^\s*-?\d+\s*$/);
  for (const extra of [{ guided_regex: '(yes|no), [0-9]{2}' }, { structured_outputs: { regex: '(yes|no), [0-9]{2}' } }]) {
    const g = await oa.completions.create({ model: MODEL, prompt: 'x', max_tokens: 16, temperature: 1, seed: 7, ...extra });
    assert.match(g.choices[0].text, /^(yes|no), [0-9]{2}$/);
    assert.equal(g.choices[0].finish_reason, 'stop');
  }
});

// response_format json_schema holds it to the schema: listed keys only, integer, enum, the required ones
// present once it stops; a 400 for a schema the server cannot read.
test('response_format json_schema: the completion follows the schema', async () => {
  const schema = { type: 'object', additionalProperties: false, required: ['n', 'color'],
    properties: { n: { type: 'integer' }, color: { enum: ['red', 'blue'] }, ok: { type: 'boolean' } } };
  for (const seed of [1, 2, 3, 4, 5, 6]) {
    const r = await oa.completions.create({ model: MODEL, prompt: 'Data:', max_tokens: 48, temperature: 1, seed,
      response_format: { type: 'json_schema', json_schema: { name: 'thing', schema } } });
    const c = r.choices[0];
    assert.match(c.text, /^\s*\{/);
    if (c.finish_reason !== 'stop') continue;
    const v = JSON.parse(c.text);
    assert.ok(Number.isInteger(v.n), c.text);
    assert.ok(['red', 'blue'].includes(v.color), c.text);
    for (const k of Object.keys(v)) assert.ok(['n', 'color', 'ok'].includes(k), c.text);
    if ('ok' in v) assert.equal(typeof v.ok, 'boolean');
  }
  const err = await oa.completions.create({ model: MODEL, prompt: 'x', max_tokens: 4,
    response_format: { type: 'json_schema', json_schema: { name: 't', schema: { type: 'strin' } } } }).then(() => null, (e) => e);
  assert.equal(err?.status, 400);
  assert.equal(err.error.param, 'response_format.json_schema.schema');
  assert.match(err.error.message, /unknown type 'strin'/);
});

// echo and the prompt's log-probs (lm-eval's loglikelihood requests: echo, logprobs 1, max_tokens 1 on token ids).
test('echo with logprobs returns the prompt\'s tokens and log-probs before the output (OpenAI\'s legacy shape)', async () => {
  const prompt = [3100, 3101, 3102, 3103, 3104, 3105, 3106];
  const r = await oa.completions.create({ model: MODEL, prompt, max_tokens: 1, temperature: 0, logprobs: 1, echo: true });
  const c = r.choices[0], lp = c.logprobs;
  assert.equal(lp.tokens.length, prompt.length + 1);
  assert.equal(lp.token_logprobs.length, prompt.length + 1);
  assert.equal(lp.token_logprobs[0], null);
  assert.equal(lp.top_logprobs[0], null);
  for (let i = 1; i < lp.tokens.length; ++i) {
    assert.ok(lp.token_logprobs[i] <= 0, `${i}`);
    assert.equal(Object.keys(lp.top_logprobs[i]).length, 1);
    // The best id is at least as likely as the actual token.
    assert.ok(Object.values(lp.top_logprobs[i])[0] >= lp.token_logprobs[i] - 1e-6, `${i}`);
  }
  const d = (await raw('/detokenize', { body: JSON.stringify({ tokens: prompt }) })).json;
  assert.equal(lp.tokens.slice(0, prompt.length).join(''), d.prompt);
  assert.ok(c.text.startsWith(d.prompt));
  assert.equal(r.usage.prompt_tokens, prompt.length);
  assert.equal(r.usage.completion_tokens, 1);
  // The generated token's log-prob, seen again as a prompt token of a longer prompt, is the same value.
  const next = (await raw('/tokenize', { body: JSON.stringify({ prompt: lp.tokens.at(-1) }) })).json;
  const longer = await oa.completions.create({
    model: MODEL, prompt: [...prompt, ...next.tokens], max_tokens: 1, temperature: 0, logprobs: 0, echo: true });
  if (next.tokens.length === 1) assert.ok(Math.abs(longer.choices[0].logprobs.token_logprobs[prompt.length] - lp.token_logprobs.at(-1)) < 1e-4);
  // echo alone: the prompt's text before the output, no log-probs.
  const plain = await oa.completions.create({ model: MODEL, prompt: 'Echo me', max_tokens: 2, temperature: 0, echo: true });
  assert.ok(plain.choices[0].text.startsWith('Echo me'));
  assert.equal(plain.choices[0].logprobs, null);
});

test('prompt_logprobs (vLLM) on completions and chat; streamed echo sends the prompt first', async () => {
  const prompt = [3200, 3201, 3202, 3203, 3204];
  const r = await oa.completions.create({ model: MODEL, prompt, max_tokens: 2, temperature: 0, prompt_logprobs: 2 });
  const pl = r.choices[0].prompt_logprobs;
  assert.equal(pl.length, prompt.length);
  assert.equal(pl[0], null);
  for (let i = 1; i < prompt.length; ++i) {
    const own = pl[i][String(prompt[i])];
    assert.ok(own && own.logprob <= 0 && own.rank >= 1 && typeof own.decoded_token === 'string', `${i}`);
    assert.ok(Object.keys(pl[i]).length >= 2 && Object.keys(pl[i]).length <= 3, `${i}`);
    assert.ok(Object.values(pl[i]).some((e) => e.rank === 1));
  }
  assert.ok(!r.choices[0].text.startsWith('\u0000'));
  const chat = await oa.chat.completions.create({ model: MODEL, messages: user('hi'), max_tokens: 2, prompt_logprobs: 0 });
  const cp = chat.choices[0].prompt_logprobs;
  assert.equal(cp.length, chat.usage.prompt_tokens);
  assert.equal(cp[0], null);
  for (const e of cp.slice(1)) assert.equal(Object.keys(e).length, 1);
  // Streamed: the first chunk holds the echoed prompt and the prompt log-probs; the text is the same.
  const whole = await oa.completions.create({ model: MODEL, prompt: 'Stream me', max_tokens: 3, temperature: 0, echo: true });
  const chunks = [];
  for await (const c of await oa.completions.create({
    model: MODEL, prompt: 'Stream me', max_tokens: 3, temperature: 0, echo: true, stream: true, prompt_logprobs: 1, logprobs: 0,
  })) chunks.push(c);
  const withChoices = chunks.filter((c) => c.choices.length);
  assert.ok(withChoices[0].choices[0].text.startsWith('Stream me'));
  assert.equal(withChoices[0].choices[0].prompt_logprobs[0], null);
  assert.equal(withChoices[0].choices[0].logprobs.token_logprobs[0], null);
  assert.equal(withChoices.map((c) => c.choices[0].text).join(''), whole.choices[0].text);
  // A batch with echo: each choice starts with its own prompt.
  const b = await oa.completions.create({ model: MODEL, prompt: ['First one', 'Second'], max_tokens: 2, temperature: 0, echo: true });
  assert.ok(b.choices[0].text.startsWith('First one'));
  assert.ok(b.choices[1].text.startsWith('Second'));
});

test('echo with max_tokens 0 scores the prompt and generates nothing (OpenAI); max_tokens 0 alone is a 400', async () => {
  const prompt = [3300, 3301, 3302, 3303];
  const r = await oa.completions.create({ model: MODEL, prompt, max_tokens: 0, echo: true, logprobs: 1 });
  const c = r.choices[0];
  const d = (await raw('/detokenize', { body: JSON.stringify({ tokens: prompt }) })).json;
  assert.equal(c.text, d.prompt);
  assert.equal(c.finish_reason, 'length');
  assert.equal(c.logprobs.tokens.length, prompt.length);
  assert.equal(c.logprobs.token_logprobs[0], null);
  for (const x of c.logprobs.token_logprobs.slice(1)) assert.ok(x <= 0);
  assert.equal(r.usage.completion_tokens, 0);
  assert.equal(r.usage.prompt_tokens, prompt.length);
  // The same scores as with one token generated.
  const one = await oa.completions.create({ model: MODEL, prompt, max_tokens: 1, temperature: 0, echo: true, logprobs: 1 });
  assert.deepEqual(one.choices[0].logprobs.token_logprobs.slice(0, prompt.length), c.logprobs.token_logprobs);
  const chunks = [];
  for await (const ch of await oa.completions.create({ model: MODEL, prompt, max_tokens: 0, echo: true, stream: true })) chunks.push(ch);
  assert.equal(chunks.filter((ch) => ch.choices.length).map((ch) => ch.choices[0].text).join(''), d.prompt);
  const err = await oa.completions.create({ model: MODEL, prompt, max_tokens: 0 }).catch((e) => e);
  assert.equal(err.status, 400);
  assert.equal(err.param, 'max_tokens');
});
