// Command-line refusals: one line on stderr naming the flag, a non-zero exit, nothing started.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { BIN } from './helpers.mjs';

function run(args) {
  const r = spawnSync(BIN, args, { encoding: 'utf8', timeout: 30_000 });
  return { status: r.status, lines: r.stderr.trim().split('\n').filter((l) => l.length > 0) };
}

for (const args of [
  ['serve', '--device', 'cpu', '--tensor-parallel-size', '2', '--port', '0'],
  ['generate', '--device', 'cpu', '--tensor-parallel-size', '2', '--model', '/nonexistent', '--prompt', 'hi'],
]) {
  test(`the CPU runner refuses tensor parallelism: ${args[0]}`, () => {
    const r = run(args);
    assert.notEqual(r.status, 0);
    assert.equal(r.lines.length, 1, r.lines.join('\n'));
    assert.match(r.lines[0], /--tensor-parallel-size 2/);
  });
}
