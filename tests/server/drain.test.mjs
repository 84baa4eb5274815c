// SIGTERM drain on a second server (so the shared one is unaffected): in-flight streams finish,
// new requests are refused, the process exits 0.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, raw, startServer, user, waitFor, FINISH, MODEL } from './helpers.mjs';

test('SIGTERM: in-flight requests finish, new ones get 503, exit code 0', async () => {
  const srv = await startServer(['--drain-timeout', '20']);
  try {
    const oa = client({ baseURL: `${srv.base}/v1` });
    const stream = await oa.chat.completions.create({ model: MODEL, messages: user('Keep going.'), max_tokens: 120, stream: true });
    const it = stream[Symbol.asyncIterator]();
    await it.next();  // the request is running
    srv.proc.kill('SIGTERM');
    // Once draining (/ready turns 503), a new request is refused: 503, or the socket is closed.
    const draining = await waitFor(async () => (await raw('/ready', { method: 'GET', base: srv.base })
      .then((r) => r.status, () => 'closed')) !== 200, { timeoutMs: 5000, stepMs: 10 });
    assert.ok(draining, '/ready stayed 200 after SIGTERM');
    const refused = await raw('/v1/chat/completions', { base: srv.base, body: JSON.stringify({ messages: user('late'), max_tokens: 2 }) })
      .then((r) => r.status, () => 'closed');
    assert.ok(refused === 503 || refused === 'closed', `late request got ${refused}`);
    let finish = null;
    for (let r = await it.next(); !r.done; r = await it.next()) if (r.value.choices[0]?.finish_reason) finish = r.value.choices[0].finish_reason;
    assert.ok(FINISH.includes(finish), `in-flight stream ended with ${finish}`);
    const { code, signal, log } = await srv.exited;
    assert.equal(code, 0, log);
    assert.equal(signal, null);
  } finally {
    srv.proc.kill('SIGKILL');
  }
});
