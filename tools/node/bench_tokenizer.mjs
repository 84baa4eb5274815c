// Encode throughput of Hugging Face tokenizers (Rust, via the npm "tokenizers" binding) and of the
// pure-JS @huggingface/tokenizers on the text that bench/tokenizer_bench writes, and an id-for-id
// check against mxserve's ids for that text:
//   build/bench/tokenizer_bench --dump-text /tmp/t.txt --dump-ids /tmp/ids.json
//   node tools/node/bench_tokenizer.mjs /tmp/t.txt /tmp/ids.json [tokenizer.json]
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Tokenizer } from 'tokenizers';

const here = path.dirname(fileURLToPath(import.meta.url));
const [textPath, idsPath] = process.argv.slice(2, 4);
const tokPath = process.argv[4] ?? path.resolve(here, '../../.assets/tokenizer/tokenizer.json');
if (!textPath) {
  console.error('usage: node bench_tokenizer.mjs TEXT_FILE [MXSERVE_IDS_JSON] [tokenizer.json]');
  process.exit(2);
}
const text = fs.readFileSync(textPath, 'utf8');
const bytes = Buffer.byteLength(text, 'utf8');
const jsonText = fs.readFileSync(tokPath, 'utf8');
// Ordinary-text mode, as tokenizer_bench measures: no added-token matching.
const cfg = JSON.parse(jsonText);
cfg.added_tokens = [];

const reps = 3;
function report(name, best, n) {
  console.log(`${name}: ${(bytes / 1e6 / best).toFixed(2).padStart(7)} MB/s ${(n / 1e6 / best).toFixed(3).padStart(7)} M tokens/s (${n} tokens, ${best.toFixed(3)} s, best of ${reps})`);
}

let t0 = performance.now();
const rust = Tokenizer.fromString(JSON.stringify(cfg));
console.log(`text: ${(bytes / 1e6).toFixed(2)} MB; HF tokenizers (Rust) load: ${((performance.now() - t0) / 1e3).toFixed(3)} s`);
let best = Infinity, ids;
for (let r = 0; r < reps; ++r) {
  t0 = performance.now();
  ids = (await rust.encode(text, null, { addSpecialTokens: false })).getIds();
  best = Math.min(best, (performance.now() - t0) / 1e3);
}
report('HF tokenizers 0.23.2 (Rust, 1 call)', best, ids.length);

// One long call is not HF's sweet spot (per-call offset bookkeeping over a 4 MB string), so also
// time ~4 KB documents cut at newlines: one call each, and encodeBatch (rayon, all cores).
const docs = [];
for (let start = 0; start < text.length;) {
  let end = text.indexOf('\n', start + 4096);
  end = end < 0 ? text.length : end + 1;
  docs.push(text.slice(start, end));
  start = end;
}
best = Infinity;
let n = 0;
for (let r = 0; r < reps; ++r) {
  t0 = performance.now();
  n = 0;
  for (const d of docs) n += (await rust.encode(d, null, { addSpecialTokens: false })).getIds().length;
  best = Math.min(best, (performance.now() - t0) / 1e3);
}
report(`HF tokenizers (Rust, ${docs.length} docs, one call each)`, best, n);
best = Infinity;
for (let r = 0; r < reps; ++r) {
  t0 = performance.now();
  const encs = await rust.encodeBatch(docs, { addSpecialTokens: false });
  n = encs.reduce((a, e) => a + e.getIds().length, 0);
  best = Math.min(best, (performance.now() - t0) / 1e3);
}
report(`HF tokenizers (Rust, encodeBatch, ${(await import('node:os')).cpus().length} cores)`, best, n);

if (idsPath) {
  const ours = JSON.parse(fs.readFileSync(idsPath, 'utf8'));
  let first = -1;
  for (let i = 0; i < Math.max(ours.length, ids.length); ++i) if (ours[i] !== ids[i]) { first = i; break; }
  console.log(first < 0 ? `mxserve ids identical (${ours.length} tokens)` : `mxserve ids DIFFER at index ${first} (ours ${ours.length}, HF ${ids.length})`);
  if (first >= 0) process.exitCode = 1;
}

try {
  const js = await import('@huggingface/tokenizers');
  t0 = performance.now();
  const jt = new js.Tokenizer(cfg, {});
  console.log(`@huggingface/tokenizers (JS) load: ${((performance.now() - t0) / 1e3).toFixed(3)} s`);
  best = Infinity;
  for (let r = 0; r < reps; ++r) {
    t0 = performance.now();
    ids = jt.encode(text, { add_special_tokens: false }).ids;
    best = Math.min(best, (performance.now() - t0) / 1e3);
  }
  report('@huggingface/tokenizers 0.2.0 (JS)', best, ids.length);
} catch (e) {
  console.log(`@huggingface/tokenizers skipped: ${e.message}`);
}
