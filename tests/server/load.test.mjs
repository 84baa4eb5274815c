// Concurrency and client disconnects.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import { client, user, metric, waitFor, FINISH, MODEL, URL_BASE } from './helpers.mjs';

const oa = client();

// Also: the 32 run at once. A streaming request holds an HTTP thread, and cpp-httplib's default pool
// (max(8, cores - 1) threads) once capped concurrent generations at that number.
test('32 concurrent streams all complete, and run at once', async () => {
  let maxRunning = 0, polling = true;
  const poll = (async () => {
    while (polling) {
      maxRunning = Math.max(maxRunning, (await metric('vllm:num_requests_running')) ?? 0);
      await new Promise((r) => setTimeout(r, 10));
    }
  })();
  const one = async (i) => {
    const stream = await oa.chat.completions.create({
      model: MODEL, messages: user(`Request number ${i}.`), max_tokens: 8, stream: true, stream_options: { include_usage: true },
    });
    let finish = null, usage = null, chunks = 0;
    for await (const c of stream) {
      chunks++;
      if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
      if (c.usage) usage = c.usage;
    }
    return { finish, usage, chunks };
  };
  const results = await Promise.all(Array.from({ length: 32 }, (_, i) => one(i)));
  polling = false;
  await poll;
  assert.ok(maxRunning >= 24, `at most ${maxRunning} of 32 streams ran at once`);
  for (const r of results) {
    assert.ok(FINISH.includes(r.finish), JSON.stringify(r));
    assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
  }
  assert.ok(await waitFor(async () => (await metric('vllm:num_requests_running')) === 0, { timeoutMs: 5000 }));
});

test('a client that aborts mid-stream frees its request', async () => {
  const ac = new AbortController();
  const stream = await oa.chat.completions.create(
    { model: MODEL, messages: user('Write a very long story.'), max_tokens: 4000, stream: true },
    { signal: ac.signal });
  // The SDK ends the iteration quietly on abort; the server sees the socket close.
  let seen = 0;
  for await (const c of stream) {
    if (c.choices.length) seen++;
    if (seen === 3) {
      assert.equal(await metric('vllm:num_requests_running'), 1);
      ac.abort();
    }
  }
  assert.ok(seen >= 3);
  const freed = await waitFor(async () => (await metric('vllm:num_requests_running')) === 0
    && (await metric('vllm:kv_cache_usage_perc')) === 0, { timeoutMs: 5000 });
  assert.ok(freed, 'vllm:num_requests_running did not return to 0 within 5 s');
  assert.ok((await metric('mxserve:kv_cache_capacity_tokens')) > 0, 'the KV capacity gauge');
  assert.ok((await metric('mxserve:engine_steps_total')) > 0, 'the engine step counter');
  assert.equal(await metric('mxserve:device_busy_seconds_total'), 0, 'no GPU time on the CPU engine');
});

test('a non-streaming client that gives up frees its request', async () => {
  const ac = new AbortController();
  const pending = oa.chat.completions.create(
    { model: MODEL, messages: user('Another very long story.'), max_tokens: 4000 }, { signal: ac.signal });
  assert.ok(await waitFor(async () => (await metric('vllm:num_requests_running')) === 1, { timeoutMs: 5000 }));
  await new Promise((r) => setTimeout(r, 500));
  ac.abort();
  await assert.rejects(pending, (e) => e.name === 'APIUserAbortError' || e.name === 'AbortError');
  const freed = await waitFor(async () => (await metric('vllm:num_requests_running')) === 0, { timeoutMs: 5000 });
  assert.ok(freed, 'the abandoned non-streaming request kept running');
});

test('prefix cache counters are exported', async () => {
  const q = await metric('vllm:prefix_cache_queries_total');
  const h = await metric('vllm:prefix_cache_hits_total');
  assert.ok(q > 0 && h > 0 && h <= q, `queries ${q} hits ${h}`);
});

// A burst of connections must not overflow the listen queue (cpp-httplib listens with a backlog of
// 5; a dropped SYN costs the client a 1 s retransmit). Counted by the kernel, so not a timing test.
test('a burst of 256 connections overflows no listen queue', { skip: !fs.existsSync('/proc/net/netstat') }, async () => {
  const overflows = () => {
    const lines = fs.readFileSync('/proc/net/netstat', 'utf8').split('\n');
    const i = lines.findIndex((l) => l.startsWith('TcpExt:'));
    const keys = lines[i].split(' '), vals = lines[i + 1].split(' ');
    return Number(vals[keys.indexOf('ListenOverflows')]);
  };
  const { hostname, port } = new URL(URL_BASE);
  const before = overflows();
  await Promise.all(Array.from({ length: 256 }, () => new Promise((resolve, reject) => {
    const s = net.connect(Number(port), hostname, () => s.end('GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'));
    s.on('data', () => {});
    s.on('close', resolve);
    s.on('error', reject);
  })));
  assert.equal(overflows() - before, 0);
});
