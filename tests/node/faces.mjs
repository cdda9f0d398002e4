// faces.mjs: the `ollama` and `@anthropic-ai/sdk` npm clients, unchanged,
// against a Baton engine's (or the broker's front door's) Ollama API and
// Anthropic Messages API (engine/serve/faces_test.py, broker/door/faces_test.py).
// Usage:
//   node faces.mjs BASE_URL MODEL   ($BATON_TOKEN: the token, as bearer and x-api-key)
// Prints one JSON object: what each call gave, for the Python test to check.
// The tool and thinking calls expect the engine's BATON_TEST_FORCE (a
// known tool call for "weather in Paris", a think block for "ponder").
import { Ollama } from "ollama";
import Anthropic from "@anthropic-ai/sdk";

const [base, model] = process.argv.slice(2);
const token = process.env.BATON_TOKEN;
const out = { ollama: {}, anthropic: {} };
const question = [{ role: "user", content: "Tell me of light." }];
const opts = { seed: 5, temperature: 0.8, num_predict: 16 };
const weatherTool = {
  type: "function",
  function: {
    name: "get_weather", description: "The weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
};

// ---- ollama ----
const ol = new Ollama({ host: base, headers: token ? { Authorization: "Bearer " + token } : {} });
const o = out.ollama;
o.version = (await ol.version()).version;
o.list = (await ol.list()).models.map((m) => m.name);
o.ps = (await ol.ps()).models.map((m) => m.name);
const show = await ol.show({ model });
o.show = { has_template: show.template.length > 0, capabilities: show.capabilities };
const chat = await ol.chat({ model, messages: question, options: opts });
o.chat = { content: chat.message.content, done: chat.done, eval_count: chat.eval_count };
let parts = 0, text = "";
for await (const part of await ol.chat({ model, messages: question, options: opts, stream: true })) {
  parts++;
  text += part.message.content;
}
o.chat_stream = { content: text, parts };
o.generate = { response: (await ol.generate({ model, prompt: "Tell me of light.", options: opts })).response };
text = "";
for await (const part of await ol.generate({ model, prompt: "Tell me of light.", options: opts, stream: true }))
  text += part.response;
o.generate_stream = text;
try {
  await ol.chat({ model: "no-such-model", messages: question });
  o.wrong_model = null;
} catch (e) {
  o.wrong_model = { status: e.status_code, error: e.error, name: e.name };
}
const weather = [{ role: "user", content: "What is the weather in Paris?" }];
const tc = await ol.chat({ model, messages: weather, tools: [weatherTool] });
o.tool_call = { calls: (tc.message.tool_calls || []).map((c) => ({ name: c.function.name, arguments: c.function.arguments })) };
const streamed = [];
for await (const part of await ol.chat({ model, messages: weather, tools: [weatherTool], stream: true }))
  for (const c of part.message.tool_calls || []) streamed.push({ name: c.function.name, arguments: c.function.arguments });
o.tool_stream = streamed;
// the round trip: the call and its result in the history
const back = await ol.chat({
  model, tools: [weatherTool], options: { num_predict: 8 },
  messages: [...weather, tc.message, { role: "tool", content: "Sunny, 21 C", tool_name: "get_weather" }],
});
o.round_trip = { ok: back.done === true && typeof back.message.content === "string" };
const th = await ol.chat({ model, messages: [{ role: "user", content: "Let me ponder." }], think: true });
o.think = { thinking: th.message.thinking || "", content: th.message.content };

// ---- @anthropic-ai/sdk ----
const an = new Anthropic({ baseURL: base, apiKey: token || "none", maxRetries: 0 });
const a = out.anthropic;
const textOf = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");
const msg = await an.messages.create({ model, max_tokens: 16, temperature: 0, messages: question });
a.message = { text: textOf(msg), stop_reason: msg.stop_reason, usage: msg.usage };
const names = [];
const st = an.messages.stream({ model, max_tokens: 16, temperature: 0, messages: question });
st.on("streamEvent", (ev) => names.push(ev.type));
let stext = "";
st.on("text", (t) => { stext += t; });
const fin = await st.finalMessage();
a.stream = { text: stext, final_stop: fin.stop_reason, final_text: textOf(fin), events: names, usage: fin.usage };
const aTool = {
  name: "get_weather", description: "The weather in a city",
  input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
};
const aw = [{ role: "user", content: "What is the weather in Paris?" }];
const tm = await an.messages.create({ model, max_tokens: 200, messages: aw, tools: [aTool] });
const uses = tm.content.filter((b) => b.type === "tool_use");
a.tool = { stop_reason: tm.stop_reason, uses: uses.map((u) => ({ name: u.name, input: u.input })), id: uses[0]?.id };
const ts = await an.messages.stream({ model, max_tokens: 200, messages: aw, tools: [aTool] }).finalMessage();
a.tool_stream = { uses: ts.content.filter((b) => b.type === "tool_use").map((u) => ({ name: u.name, input: u.input })) };
const rt = await an.messages.create({
  model, max_tokens: 8, tools: [aTool],
  messages: [...aw, { role: "assistant", content: tm.content },
    { role: "user", content: [{ type: "tool_result", tool_use_id: uses[0]?.id, content: "Sunny, 21 C" }] }],
});
a.round_trip = { ok: rt.type === "message" && Array.isArray(rt.content) };
const tk = await an.messages.create({
  model, max_tokens: 200, messages: [{ role: "user", content: "Let me ponder." }],
  thinking: { type: "enabled", budget_tokens: 1024 },
});
a.thinking = {
  thinking: tk.content.filter((b) => b.type === "thinking").map((b) => b.thinking).join(""),
  text: textOf(tk),
};
a.count = (await an.messages.countTokens({ model, messages: question })).input_tokens;
for (const [key, body] of [["wrong_model", { model: "no-such-model", max_tokens: 4, messages: question }],
  ["no_max_tokens", { model, messages: question }]]) {
  try {
    await an.messages.create(body);
    a[key] = null;
  } catch (e) {
    a[key] = { status: e.status, type: e.error?.error?.type, message: e.error?.error?.message || e.message };
  }
}
console.log(JSON.stringify(out));
