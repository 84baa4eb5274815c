// Faults from clients (issue 31): streams dropped at random points, slow readers, bodies cut off
// mid-send, generated malformed bodies, oversize headers. After each the server answers, nothing is
// running and the KV cache is back to empty; no request gets a 5xx.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { raw, metric, waitFor, MODEL, URL_BASE, API_KEY } from './helpers.mjs';

const { hostname, port } = new URL(URL_BASE);

async function settled() {
  assert.equal((await raw('/health', { method: 'GET' })).status, 200);
  const idle = await waitFor(async () => (await metric('vllm:num_requests_running')) === 0
    && (await metric('vllm:num_requests_waiting')) === 0 && (await metric('vllm:kv_cache_usage_perc')) === 0,
  { timeoutMs: 20_000 });
  assert.ok(idle, `not idle: running ${await metric('vllm:num_requests_running')}, KV ${await metric('vllm:kv_cache_usage_perc')}`);
}

// A deterministic generator (the same bodies every run).
function rng(seed) {
  let s = seed >>> 0;
  return () => { s = (s * 1664525 + 1013904223) >>> 0; return s / 2 ** 32; };
}

const headers = { Authorization: `Bearer ${API_KEY}`, 'Content-Type': 'application/json' };

test('200 streams dropped at random points free everything', async () => {
  const r = rng(1);
  const one = async (i) => {
    const ac = new AbortController();
    const path = ['/v1/chat/completions', '/v1/completions', '/v1/responses'][i % 3];
    const body = path === '/v1/chat/completions' ? { messages: [{ role: 'user', content: `drop ${i}` }], max_tokens: 32, stream: true }
      : path === '/v1/completions' ? { prompt: `drop ${i}`, max_tokens: 32, stream: true }
        : { input: `drop ${i}`, max_output_tokens: 32, stream: true };
    const reads = Math.floor(r() * 8);  // 0: drop right after the request is sent
    try {
      const res = await fetch(`${URL_BASE}${path}`, { method: 'POST', headers, body: JSON.stringify({ model: MODEL, ...body }), signal: ac.signal });
      const reader = res.body.getReader();
      for (let k = 0; k < reads; ++k) if ((await reader.read()).done) break;
    } catch { /* aborted */ }
    ac.abort();
  };
  await Promise.all(Array.from({ length: 200 }, (_, i) => one(i)));
  await settled();
});

test('a slow reader does not hold up others, and still gets its whole stream', async () => {
  const sock = net.connect(Number(port), hostname);
  await new Promise((res) => sock.on('connect', res));
  const body = JSON.stringify({ model: MODEL, prompt: 'slow', max_tokens: 48, stream: true });
  sock.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${API_KEY}\r\nContent-Type: application/json\r\n`
    + `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
  sock.pause();  // read nothing for now
  const t0 = Date.now();
  const quick = await raw('/v1/completions', { body: JSON.stringify({ model: MODEL, prompt: 'quick', max_tokens: 4 }) });
  assert.equal(quick.status, 200);
  assert.ok(Date.now() - t0 < 10_000);
  await new Promise((res) => setTimeout(res, 1000));
  let text = '';
  sock.on('data', (d) => { text += d.toString(); });
  sock.resume();
  await new Promise((res) => sock.on('close', res));
  assert.match(text, /^HTTP\/1\.1 200/);
  assert.ok(text.includes('data: [DONE]'), 'the slow reader got the end of its stream');
  await settled();
});

test('bodies cut off mid-send are dropped without a request left behind', async () => {
  for (let i = 0; i < 20; ++i) {
    const body = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'cut '.repeat(50) }], max_tokens: 8 });
    const sock = net.connect(Number(port), hostname);
    await new Promise((res) => sock.on('connect', res));
    sock.on('error', () => {});
    sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${API_KEY}\r\n`
      + `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body.slice(0, body.length / 2)}`);
    if (i % 2) sock.destroy();  // the client is gone
    else sock.end();            // half-closed: the server reads EOF before the body's end
  }
  await settled();
});

// Valid base bodies, each field replaced by values of every wrong kind; bodies that stay valid run
// (4 tokens), the rest must be 4xx with OpenAI's error shape; never 5xx.
test('1,000 generated malformed bodies get 4xx errors in the OpenAI shape', async () => {
  const r = rng(7);
  const bases = {
    '/v1/chat/completions': { model: MODEL, messages: [{ role: 'user', content: 'x' }], max_tokens: 4 },
    '/v1/completions': { model: MODEL, prompt: 'x', max_tokens: 4 },
    '/v1/responses': { model: MODEL, input: 'x', max_output_tokens: 4 },
  };
  const fields = ['model', 'messages', 'prompt', 'input', 'max_tokens', 'max_output_tokens', 'temperature', 'top_p', 'top_k',
    'n', 'stop', 'stream', 'tools', 'tool_choice', 'logprobs', 'top_logprobs', 'seed', 'instructions', 'reasoning',
    'previous_response_id', 'stream_options', 'stop_token_ids', 'min_p', 'presence_penalty'];
  // (No null: a null max_tokens means "to the context", a long generation on the CPU.)
  const bad = [-1, 0, 1e9, -1e9, 1.5, 'x', '', [], [1, 'a'], {}, { a: 1 }, true, 'é'.repeat(3000), [[[]]]];
  const paths = Object.keys(bases);
  const counts = {};
  const cases = [];
  for (let i = 0; i < 1000; ++i) {
    const path = paths[Math.floor(r() * paths.length)];
    let text;
    if (i % 10 === 9) {  // not JSON, or not an object
      const junk = ['{', '[]', '"x"', '{"model": }', '\u0000\u0001', '{"a":1}{', 'null', '{'.repeat(2000)];
      text = junk[Math.floor(r() * junk.length)];
    } else {
      const body = structuredClone(bases[path]);
      const k = 1 + Math.floor(r() * 3);
      for (let j = 0; j < k; ++j) body[fields[Math.floor(r() * fields.length)]] = bad[Math.floor(r() * bad.length)];
      text = JSON.stringify(body);
    }
    cases.push([path, text]);
  }
  for (let i = 0; i < cases.length; i += 25) {  // 25 at a time: the valid ones generate
    await Promise.all(cases.slice(i, i + 25).map(async ([path, text]) => {
      const res = await raw(path, { body: text });
      counts[res.status] = (counts[res.status] ?? 0) + 1;
      assert.ok(res.status < 500, `${path} ${text.slice(0, 200)} -> ${res.status} ${res.text.slice(0, 200)}`);
      if (res.status !== 200) {
        assert.equal(typeof res.json?.error?.message, 'string', `${path} ${text.slice(0, 200)} -> ${res.text.slice(0, 200)}`);
        assert.equal(typeof res.json.error.type, 'string');
        assert.ok('param' in res.json.error && 'code' in res.json.error);
      }
    }));
  }
  assert.ok((counts[400] ?? 0) > 500, JSON.stringify(counts));
  await settled();
});

test('oversize headers are refused and the server goes on', async () => {
  for (const size of [10_000, 100_000]) {
    const text = await new Promise((resolve) => {
      const sock = net.connect(Number(port), hostname, () => {
        sock.write(`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(size)}\r\nConnection: close\r\n\r\n`);
      });
      let out = '';
      sock.on('data', (d) => { out += d.toString(); });
      sock.on('error', () => resolve(out));
      sock.on('close', () => resolve(out));
    });
    assert.ok(text === '' || /^HTTP\/1\.1 [2-4]\d\d/.test(text), text.slice(0, 100));
  }
  await settled();
});
