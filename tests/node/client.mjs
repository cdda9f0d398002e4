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
// Fields SDKs and apps send with their defaults pass (and one outside the reference is ignored).
const lenient = await client.chat.completions.create({
  model, messages, max_tokens: 4, metadata: { app: "test" }, store: false, parallel_tool_calls: true,
  reasoning_effort: "low", response_format: { type: "text" }, logprobs: false, service_tier: "auto", user: "u",
  tools: [], tool_choice: "none", seed: null, stop: null, frobnicate: 1,
});
out.lenient = { finish: lenient.choices[0].finish_reason };
// logprobs (streamed), echo and a token-id prompt through the client
const lps = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0, logprobs: true,
                                                   top_logprobs: 2, stream: true });
out.logprobs = [];
for await (const chunk of lps)
  for (const c of chunk.choices) for (const e of (c.logprobs && c.logprobs.content) || []) out.logprobs.push(e);
const echo = await client.completions.create({ model, prompt: "In the beginning", max_tokens: 4, temperature: 0,
                                               echo: true });
out.echo = echo.choices[0].text;
try {
  await client.chat.completions.create({ model, messages, tool_choice: "required" });
  out.required_no_tools = null;
} catch (e) {
  out.required_no_tools = { status: e.status, param: e.param, message: e.message };
}

// A tool round trip. With BATON_TEST_FORCE set (the engine's test hook), the question about Paris is
// answered with a Hermes/Qwen3 tool call; the answer to the tool's result is the model's own.
if (process.env.BATON_TOOL_TEST) {
  const tools = [{ type: "function", function: { name: "get_weather", description: "The weather in a city",
                                                 parameters: { type: "object", properties: { city: { type: "string" } },
                                                               required: ["city"] } } }];
  const ask = [{ role: "user", content: "What is the weather in Paris?" }];
  // 160 tokens: the tiny test model's byte-level tokenizer spends about one a character on the call
  const t1 = await client.chat.completions.create({ model, messages: ask, tools, tool_choice: "auto", max_tokens: 160 });
  const m1 = t1.choices[0].message;
  out.tool_call = { finish: t1.choices[0].finish_reason, content: m1.content, calls: m1.tool_calls };
  const ts = await client.chat.completions.create({ model, messages: ask, tools, max_tokens: 160, stream: true });
  const calls = [];
  let sfinish = null, scontent = "";
  for await (const chunk of ts) {
    for (const c of chunk.choices) {
      if (c.delta.content) scontent += c.delta.content;
      for (const tc of c.delta.tool_calls || []) {
        if (!calls[tc.index]) calls[tc.index] = { id: tc.id, type: tc.type, function: { name: tc.function.name, arguments: "" } };
        calls[tc.index].function.arguments += tc.function.arguments || "";
      }
      if (c.finish_reason) sfinish = c.finish_reason;
    }
  }
  out.tool_stream = { finish: sfinish, calls, content: scontent };
  const t2 = await client.chat.completions.create({
    model, tools, max_tokens: 8, seed: 3,
    messages: [...ask, m1, { role: "tool", tool_call_id: m1.tool_calls[0].id, content: "Sunny, 21 C" }],
  });
  out.tool_answer = { finish: t2.choices[0].finish_reason, content: t2.choices[0].message.content,
                      calls: t2.choices[0].message.tool_calls || null, prompt_tokens: t2.usage.prompt_tokens };
  // tool_choice "required": the grammar makes the output a call of one of the tools
  const empty = { type: "object", properties: {}, additionalProperties: false };
  const req = await client.chat.completions.create({ model, messages, tool_choice: "required", max_tokens: 400, seed: 2,
                                                     parallel_tool_calls: false,
                                                     tools: [{ type: "function", function: { name: "f", parameters: empty } },
                                                             { type: "function", function: { name: "g", parameters: empty } }] });
  out.required = { finish: req.choices[0].finish_reason, content: req.choices[0].message.content,
                   calls: req.choices[0].message.tool_calls || null };
  // reasoning: the forced answer thinks first
  const r1 = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Do ponder." }], max_tokens: 64 });
  out.reasoning = { content: r1.choices[0].message.content, reasoning: r1.choices[0].message.reasoning_content };
  const rs = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Do ponder." }], max_tokens: 64,
                                                    stream: true });
  out.reasoning_stream = { content: "", reasoning: "" };
  for await (const chunk of rs)
    for (const c of chunk.choices) {
      out.reasoning_stream.content += c.delta.content || "";
      out.reasoning_stream.reasoning += c.delta.reasoning_content || "";
    }
}
console.log(JSON.stringify(out));
