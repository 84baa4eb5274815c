// /v1/responses through the OpenAI SDK. The demo model has random weights, so these assert shapes,
// event order, counts and statuses, never the text (the item builder's content is unit-tested in
// tests/unit/server/test_responses.cpp).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, raw, MODEL } from './helpers.mjs';

const oa = client();
const STATUS = ['completed', 'incomplete'];

function checkResponse(r) {
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.equal(r.model, MODEL);
  assert.ok(STATUS.includes(r.status), r.status);
  if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.ok(Array.isArray(r.output));
  for (const it of r.output) assert.ok(['reasoning', 'message', 'function_call'].includes(it.type), it.type);
  assert.equal(typeof r.output_text, 'string');
  const u = r.usage;
  assert.ok(u.input_tokens > 0);
  assert.ok(u.output_tokens >= 1);
  assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
  assert.equal(typeof u.input_tokens_details.cached_tokens, 'number');
  assert.ok(u.output_tokens_details.reasoning_tokens >= 0 && u.output_tokens_details.reasoning_tokens <= u.output_tokens);
}

test('non-streaming response: status, items, usage; retrieve and delete', async () => {
  const r = await oa.responses.create({ model: MODEL, input: 'Say hi.', instructions: 'Be brief.', max_output_tokens: 12 });
  checkResponse(r);
  assert.ok(r.usage.output_tokens <= 12);
  assert.equal(r.instructions, 'Be brief.');
  assert.equal(r.store, true);
  const again = await oa.responses.retrieve(r.id);
  assert.equal(again.id, r.id);
  assert.deepEqual(again.output, r.output);
  await oa.responses.delete(r.id);
  const gone = await raw(`/v1/responses/${r.id}`, { method: 'GET' });
  assert.equal(gone.status, 404);
  assert.equal(gone.json.error.type, 'not_found_error');
});

test('streaming response: created, in_progress, item events, a final event, increasing sequence numbers', async () => {
  const events = [];
  for await (const e of await oa.responses.create({ model: MODEL, input: 'Stream please.', max_output_tokens: 16, stream: true }))
    events.push(e);
  assert.equal(events[0].type, 'response.created');
  assert.equal(events[0].response.status, 'in_progress');
  assert.equal(events[1].type, 'response.in_progress');
  const last = events[events.length - 1];
  assert.ok(['response.completed', 'response.incomplete'].includes(last.type), last.type);
  checkResponse(last.response);
  events.forEach((e, i) => assert.equal(e.sequence_number, i));
  // Every added item is done before the next one is added, and the deltas rebuild the final items.
  let open = -1;
  for (const e of events) {
    if (e.type === 'response.output_item.added') { assert.equal(open, -1); open = e.output_index; }
    if (e.type === 'response.output_item.done') { assert.equal(e.output_index, open); open = -1; }
  }
  assert.equal(open, -1);
  const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  assert.equal(text, last.response.output_text);
});

test('the SDK stream helper rebuilds the same items from the events', async () => {
  const stream = oa.responses.stream({ model: MODEL, input: 'Helper.', max_output_tokens: 24 });
  let last;
  for await (const e of stream) last = e;
  assert.ok(['response.completed', 'response.incomplete'].includes(last.type), last.type);
  // The helper accumulates output_item.added, content_part.added and the deltas (it takes the final
  // object only from response.completed): its items must carry the final text and arguments.
  const snap = await stream.finalResponse();
  const fin = last.response.output;
  assert.equal(snap.output.length, fin.length);
  snap.output.forEach((it, i) => {
    assert.equal(it.type, fin[i].type);
    if (it.type === 'function_call') assert.equal(it.arguments, fin[i].arguments);
    else assert.equal(it.content[0].text, fin[i].content[0].text);
  });
});

test('a function-call round trip and previous_response_id continue the conversation', async () => {
  const tools = [{ type: 'function', name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } }];
  const first = await oa.responses.create({ model: MODEL, input: 'Weather in Oslo?', tools, max_output_tokens: 8 });
  checkResponse(first);
  const second = await oa.responses.create({
    model: MODEL, tools, max_output_tokens: 8, previous_response_id: first.id,
    input: [
      { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Oslo"}' },
      { type: 'function_call_output', call_id: 'call_1', output: '12 C, cloudy' },
    ],
  });
  checkResponse(second);
  assert.equal(second.previous_response_id, first.id);
  assert.ok(second.usage.input_tokens > first.usage.input_tokens, 'the stored conversation is in the prompt');
});

test('store false keeps nothing; tool_choice none and a named function are accepted', async () => {
  const tools = [{ type: 'function', name: 'f', parameters: { type: 'object' } }];
  const r = await oa.responses.create({ model: MODEL, input: 'x', store: false, tools, tool_choice: 'none', max_output_tokens: 4 });
  checkResponse(r);
  assert.equal((await raw(`/v1/responses/${r.id}`, { method: 'GET' })).status, 404);
  checkResponse(await oa.responses.create({ model: MODEL, input: 'x', tools, tool_choice: { type: 'function', name: 'f' }, max_output_tokens: 4 }));
});

test('bad inputs answer 400 (404 for unknown ids) in the OpenAI error shape, naming the parameter', async () => {
  const cases = [
    [{}, 400, 'input'],
    [{ input: 5 }, 400, 'input'],
    [{ input: [{ type: 'image' }] }, 400, 'input[0].type'],
    [{ input: 'x', tools: [{ type: 'web_search' }] }, 400, 'tools[0].type'],
    [{ input: 'x', tools: [{ type: 'function', name: 'f' }], tool_choice: { type: 'function', name: 'g' } }, 400, 'tool_choice'],
    [{ input: 'x', max_output_tokens: 0 }, 400, 'max_output_tokens'],
    [{ input: 'x', temperature: 5 }, 400, 'temperature'],
    [{ input: 'x', previous_response_id: 'resp_missing' }, 404, 'previous_response_id'],
  ];
  for (const [body, status, param] of cases) {
    const r = await raw('/v1/responses', { body: JSON.stringify(body) });
    assert.equal(r.status, status, JSON.stringify(body));
    assert.equal(r.json.error.param, param, JSON.stringify(body));
    assert.equal(typeof r.json.error.message, 'string');
  }
  assert.equal((await raw('/v1/responses', { body: '{"input": ' })).status, 400);
  assert.equal((await raw('/v1/responses/resp_nope', { method: 'DELETE' })).status, 404);
});

test('tool_choice naming a function forces a call to it (chat and responses)', async () => {
  const fn = { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } };
  const chat = await oa.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Weather?' }], max_tokens: 8,
    tools: [{ type: 'function', function: fn }], tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  const calls = chat.choices[0].message.tool_calls;
  assert.ok(calls && calls.length >= 1, 'a tool call');
  assert.equal(calls[0].function.name, 'get_weather');
  assert.equal(typeof calls[0].function.arguments, 'string');
  const r = await oa.responses.create({
    model: MODEL, input: 'Weather?', max_output_tokens: 8,
    tools: [{ type: 'function', ...fn }], tool_choice: { type: 'function', name: 'get_weather' },
  });
  checkResponse(r);
  assert.equal(r.output[0].type, 'function_call');
  assert.equal(r.output[0].name, 'get_weather');
  assert.match(r.output[0].call_id, /^call_/);
  // required lets the model name the function (a random model may not finish a header): shapes only.
  checkResponse(await oa.responses.create({ model: MODEL, input: 'x', max_output_tokens: 8, tools: [{ type: 'function', ...fn }], tool_choice: 'required' }));
});
