// client.mjs: the `openai` npm client, unchanged, against a Baton engine's
// (or the broker's front door's) OpenAI-compatible API. Usage:
//   node client.mjs BASE_URL MODEL   (BASE_URL without /v1; $BATON_TOKEN: the bearer token)
// Prints one JSON object: what each call gave, for the Python test to check.
import OpenAI from "openai";

const [base, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + "/v1", apiKey: process.env.BATON_TOKEN || "none", maxRetries: 0 });
const messages = [{ role: "user", content: "Tell me of light." }];
const out = {};

const chat = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0.8, seed: 5 });
out.chat = { text: chat.choices[0].message.content, finish: chat.choices[0].finish_reason, usage: chat.usage,
             object: chat.object, role: chat.choices[0].message.role };

const t0 = Date.now();
const stream = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0.8, seed: 5,
                                                      stream: true, stream_options: { include_usage: true } });
const s = { text: "", chunks: 0, role: null, finish: null, usage: null, first_ms: null };
for await (const chunk of stream) {
  s.chunks++;
  if (chunk.usage) s.usage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta.role) s.role = c.delta.role;
    if (c.delta.content) {
      if (s.first_ms === null) s.first_ms = Date.now() - t0;
      s.text += c.delta.content;
    }
    if (c.finish_reason) s.finish = c.finish_reason;
  }
}
s.total_ms = Date.now() - t0;
out.stream = s;

const compl = await client.completions.create({ model, prompt: "In the beginning", max_tokens: 12, temperature: 0 });
out.completion = { text: compl.choices[0].text, finish: compl.choices[0].finish_reason, usage: compl.usage };
const cs = await client.completions.create({ model, prompt: "In the beginning", max_tokens: 12, temperature: 0,
                                             stream: true });
let ctext = "";
for await (const chunk of cs) for (const c of chunk.choices) ctext += c.text;
out.completion_stream = ctext;

out.models = (await client.models.list()).data.map((m) => m.id);
try {
  await client.chat.completions.create({ model: "no-such-model", messages });
  out.wrong_model = null;
} catch (e) {
  out.wrong_model = { status: e.status, code: e.code, type: e.type, param: e.param };
}
try {
  await client.chat.completions.create({ model, messages, tools: [{ type: "function", function: { name: "f" } }] });
  out.tools = null;
} catch (e) {
  out.tools = { status: e.status, param: e.param, message: e.message };
}
console.log(JSON.stringify(out));
