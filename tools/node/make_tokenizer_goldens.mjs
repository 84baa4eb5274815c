// Golden token ids for tests/unit/tokenizer, from Hugging Face's own tokenizers library (the Rust
// crate through its official node binding, npm "tokenizers").
//   cd tools/node && npm ci && node make_tokenizer_goldens.mjs [tokenizer.json] [corpus.jsonl] [out.jsonl]
// For each corpus line {name, text} it writes {name, ordinary, special, decoded, pieces}:
//   special  = ids with added/special tokens matched (HF default encode, no post-processing),
//   ordinary = ids with special-token text encoded as plain text (HF's encode_special_tokens=true,
//              reproduced by loading the same tokenizer.json with added_tokens emptied),
//   decoded  = HF decode(special, skip_special_tokens=false),
//   pieces   = the pre-tokenizer's split of the whole text, in byte-level form ("Ġ" = space).
// It also runs the pure-JS @huggingface/tokenizers on the same corpus and reports disagreements
// (information only: the Rust library is the reference).
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Tokenizer } from 'tokenizers';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../..');
const tokPath = process.argv[2] ?? path.join(root, '.assets/tokenizer/tokenizer.json');
const corpusPath = process.argv[3] ?? path.join(root, 'tests/data/tokenizer/corpus.jsonl');
const outPath = process.argv[4] ?? path.join(root, 'tests/data/tokenizer/goldens.jsonl');

const jsonText = fs.readFileSync(tokPath, 'utf8');
const withSpecial = Tokenizer.fromString(jsonText);
const plainJson = JSON.parse(jsonText);
plainJson.added_tokens = [];
const ordinary = Tokenizer.fromString(JSON.stringify(plainJson));

const corpus = fs.readFileSync(corpusPath, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
const names = new Set();
const lines = [];
for (const { name, text } of corpus) {
  if (names.has(name)) throw new Error(`duplicate corpus name ${name}`);
  names.add(name);
  const sp = (await withSpecial.encode(text, null, { addSpecialTokens: false })).getIds();
  const ord = (await ordinary.encode(text, null, { addSpecialTokens: false })).getIds();
  const decoded = await withSpecial.decode(sp, false);
  const pieces = withSpecial.getPreTokenizer().preTokenizeString(text).map((p) => p[0]);
  lines.push({ name, ordinary: ord, special: sp, decoded, pieces });
}
fs.writeFileSync(outPath, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
console.log(`wrote ${lines.length} goldens to ${path.relative(process.cwd(), outPath)}`);

// Lossy decoding of id prefixes that cut characters: HF's decode (from_utf8_lossy) per prefix.
const decodeOut = path.join(path.dirname(outPath), 'decode_goldens.jsonl');
const decodeLines = [];
for (const name of ['emoji_zwj', 'emoji_skin_tones', 'emoji_flags_keycaps', 'chinese', 'hindi', 'private_use_and_rare']) {
  const ids = lines.find((l) => l.name === name).special.slice(0, 40);
  for (let k = 1; k <= ids.length; ++k) {
    decodeLines.push({ ids: ids.slice(0, k), text: await withSpecial.decode(ids.slice(0, k), false) });
  }
}
fs.writeFileSync(decodeOut, decodeLines.map((l) => JSON.stringify(l)).join('\n') + '\n');
console.log(`wrote ${decodeLines.length} decode goldens`);

// Cross-check with the pure-JS implementation.
try {
  const js = await import('@huggingface/tokenizers');
  const cfgPath = path.join(path.dirname(tokPath), 'tokenizer_config.json');
  const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, 'utf8')) : {};
  const jt = new js.Tokenizer(JSON.parse(jsonText), cfg);
  let bad = 0;
  for (let i = 0; i < corpus.length; ++i) {
    const ids = jt.encode(corpus[i].text, { add_special_tokens: false }).ids;
    if (JSON.stringify(ids) !== JSON.stringify(lines[i].special)) {
      ++bad;
      console.log(`  @huggingface/tokenizers differs on '${corpus[i].name}'`);
    }
  }
  console.log(`@huggingface/tokenizers cross-check: ${corpus.length - bad}/${corpus.length} identical`);
} catch (e) {
  console.log(`@huggingface/tokenizers cross-check skipped: ${e.message}`);
}
