// Renders tests/data/harmony/requests/*.json with the official gpt-oss chat template
// (../shared/reference/gpt-oss-chat-template.jinja, copied to tests/data/harmony/) through
// @huggingface/jinja, writing tests/data/harmony/expected/NAME.txt. Requests must not contain
// tool-call history (there the template and harmony differ; harmony is our reference).
//   node tools/node/make_harmony_goldens.mjs
import { Template } from "@huggingface/jinja";
import fs from "node:fs";
import path from "node:path";

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "../..");
const dir = path.join(root, "tests/data/harmony");
const template = new Template(fs.readFileSync(path.join(dir, "chat_template.jinja"), "utf8"));
// The template calls strftime_now("%Y-%m-%d"), which @huggingface/jinja implements with the clock:
// pin the clock so the goldens carry a fixed date.
process.env.TZ = "UTC";
const FIXED = new Date("2026-11-23T12:00:00Z").getTime();
const RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...a) { super(...(a.length ? a : [FIXED])); }
  static now() { return FIXED; }
};

for (const f of fs.readdirSync(path.join(dir, "requests")).sort()) {
  const req = JSON.parse(fs.readFileSync(path.join(dir, "requests", f), "utf8"));
  // The template reads plain string contents; join text parts the way the server does.
  const messages = req.messages.map((m) => {
    const c = Array.isArray(m.content) ? m.content.map((p) => p.text).join("") : m.content;
    const out = { ...m, content: c };
    if (m.reasoning_content !== undefined) { out.thinking = m.reasoning_content; delete out.reasoning_content; }
    return out;
  });
  const ctx = {
    messages, add_generation_prompt: true,
    ...(req.tools ? { tools: req.tools } : {}),
    ...(req.reasoning_effort ? { reasoning_effort: req.reasoning_effort } : {}),
  };
  const text = template.render(ctx);
  fs.writeFileSync(path.join(dir, "expected", f.replace(/\.json$/, ".txt")), text);
  console.log(f, text.length);
}
