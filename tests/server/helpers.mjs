// Shared set-up for the black-box tests: run.sh starts the server and exports its address.
import { spawn } from 'node:child_process';
import OpenAI from 'openai';

export const URL_BASE = process.env.MXSERVE_URL;
export const API_KEY = process.env.MXSERVE_API_KEY;
export const BIN = process.env.MXSERVE_BIN;
if (!URL_BASE || !API_KEY) throw new Error('run these tests with tests/server/run.sh BINARY');

export const MODEL = 'mxserve-demo-tiny';
export const FINISH = ['stop', 'length', 'tool_calls'];

export function client(opts = {}) {
  return new OpenAI({ baseURL: `${URL_BASE}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 60_000, ...opts });
}

export const user = (text) => [{ role: 'user', content: text }];

// A raw HTTP request, for what the SDK cannot send (bad JSON, wrong headers).
export async function raw(path, { method = 'POST', body, headers = {}, base = URL_BASE, key = API_KEY } = {}) {
  const h = { ...(key ? { Authorization: `Bearer ${key}` } : {}), ...headers };
  if (body !== undefined && !('Content-Type' in h)) h['Content-Type'] = 'application/json';
  const res = await fetch(`${base}${path}`, { method, headers: h, body });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, text, json };
}

// Value of one Prometheus series (model label included) from /metrics.
export async function metric(name, base = URL_BASE) {
  const { text } = await raw('/metrics', { method: 'GET', base });
  const m = text.match(new RegExp(`^${name.replace(/[:]/g, '\\:')}\\{[^}]*\\} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : undefined;
}

export async function waitFor(pred, { timeoutMs = 5000, stepMs = 50 } = {}) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (await pred()) return true;
    if (Date.now() > end) return false;
    await new Promise((r) => setTimeout(r, stepMs));
  }
}

// Starts a second server (for tests that stop it); resolves with {proc, base, exited}.
export async function startServer(args = []) {
  const proc = spawn(BIN, ['serve', '--port', '0', '--api-key', API_KEY, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal, log })));
  const base = await new Promise((resolve, reject) => {
    const onData = (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) resolve(`http://127.0.0.1:${m[1]}`);
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.on('exit', () => reject(new Error(`server exited during start-up:\n${log}`)));
  });
  const ready = await waitFor(async () => (await raw('/ready', { method: 'GET', base }).catch(() => ({}))).status === 200,
    { timeoutMs: 60_000, stepMs: 100 });
  if (!ready) { proc.kill('SIGKILL'); throw new Error(`second server not ready:\n${log}`); }
  return { proc, base, exited };
}
