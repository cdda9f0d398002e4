// sdks.mjs: the `openai` client's Responses API, the Vercel AI SDK (`ai` with
// @ai-sdk/openai's default provider, which calls /v1/responses, its .chat()
// provider and @ai-sdk/openai-compatible) and @langchain/openai, all
// unchanged from the registry, against a Baton engine or the front door.
// Usage:
//   node sdks.mjs BASE_URL MODEL   (BASE_URL without /v1; $BATON_TOKEN: the bearer token)
// The engine runs with BATON_TEST_FORCE (engine/serve/responses_test.py):
// a question about "weather in Paris" is answered with a get_weather call,
// "Describe Noah" with a JSON object, so that the tiny models' random
// answers do not decide the tool and structured-output paths.
// Prints one JSON object: each case's result or {"error": message}, for the
// Python test to check (engine/serve/responses_test.py, broker/door/door_test.py).
import OpenAI from "openai";
import { generateText, generateObject, streamText, tool, stepCountIs } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { ChatOpenAI } from "@langchain/openai";
import { tool as lcTool } from "@langchain/core/tools";
import { z } from "zod";

const [base, model] = process.argv.slice(2);
const apiKey = process.env.BATON_TOKEN || "none";
const client = new OpenAI({ baseURL: base + "/v1", apiKey, maxRetries: 0 });
const out = {};
// $BATON_SDK_PLAIN: only the plain text cases (kjv-mixtral: its template takes no tools, and the test
// hook's forced JSON encodes with SentencePiece's leading space, which the grammar refuses)
const plain = !!process.env.BATON_SDK_PLAIN;

// Node 18 (Debian 12's nodejs) has no global `crypto` (Web Crypto is global
// from Node 19): langsmith, which @langchain/core runs withStructuredOutput's
// chain under, calls crypto.getRandomValues and throws. Those cases are
// reported skipped, with why, and the Python test says so in its line.
const noCrypto = typeof globalThis.crypto === "undefined";

async function run(name, fn, needsCrypto = false) {
  if (plain && /tools|format|object|structured/.test(name)) return;
  if (needsCrypto && noCrypto) {
    out[name] = { skipped: "Node " + process.versions.node + " has no global crypto (Node 19 and later have " +
                  "it), which LangChain's withStructuredOutput needs" };
    return;
  }
  try {
    out[name] = await fn();
  } catch (e) {
    out[name] = { error: String(e && e.stack ? e.stack : e).slice(0, 1500) };
  }
}

const weatherParams = { type: "object", properties: { city: { type: "string" } }, required: ["city"] };
const person = z.object({ name: z.string().max(12), old: z.boolean() });

// ---- openai: responses.create, whole and streamed, tools, text.format ----
await run("responses", async () => {
  const r = await client.responses.create({ model, input: "Tell me of light.", instructions: "Be brief.",
                                            max_output_tokens: 16, temperature: 0 });
  return { text: r.output_text, status: r.status, usage: r.usage, id: r.id, object: r.object };
});
await run("responses_stream", async () => {
  const stream = await client.responses.create({ model, input: "Tell me of light.", instructions: "Be brief.",
                                                 max_output_tokens: 16, temperature: 0, stream: true });
  const s = { types: [], text: "", final: null };
  for await (const ev of stream) {
    s.types.push(ev.type);
    if (ev.type === "response.output_text.delta") s.text += ev.delta;
    if (ev.type === "response.completed" || ev.type === "response.incomplete") s.final = ev.response.usage;
  }
  // the helper that accumulates and checks the events' order
  const h = client.responses.stream({ model, input: "Tell me of light.", instructions: "Be brief.",
                                      max_output_tokens: 16, temperature: 0 });
  const fin = await h.finalResponse();
  s.helper_text = fin.output_text;
  return s;
});
await run("responses_logprobs", async () => {
  const r = await client.responses.create({ model, input: "Tell me of light.", max_output_tokens: 8, temperature: 0,
                                            top_logprobs: 2, include: ["message.output_text.logprobs"] });
  const part = r.output.filter((o) => o.type === "message").flatMap((o) => o.content)[0] || { logprobs: [] };
  return { text: r.output_text, tokens: part.logprobs.map((l) => l.token),
           tops: part.logprobs.map((l) => l.top_logprobs.length) };
});
await run("responses_tools", async () => {
  const tools = [{ type: "function", name: "get_weather", description: "The weather in a city",
                   parameters: weatherParams, strict: false }];
  const input = [{ role: "user", content: "What is the weather in Paris?" }];
  // 160 tokens for a call: the tiny test model's byte-level tokenizer spends about one a character
  const r = await client.responses.create({ model, input, tools, max_output_tokens: 160 });
  const call = r.output.find((o) => o.type === "function_call");
  const stream = await client.responses.create({ model, input, tools, max_output_tokens: 160, stream: true });
  let args = "";
  for await (const ev of stream) if (ev.type === "response.function_call_arguments.delta") args += ev.delta;
  // the round trip: the call and its output go back in the input
  const r2 = await client.responses.create({ model, tools, max_output_tokens: 8, input: [
    ...input, call, { type: "function_call_output", call_id: call.call_id, output: "Sunny, 21 C" }] });
  return { name: call.name, arguments: call.arguments, call_id: call.call_id, streamed_args: args,
           answer_status: r2.status, answer_calls: r2.output.filter((o) => o.type === "function_call").length };
});
await run("responses_format", async () => {
  const r = await client.responses.create({ model, input: "Describe Noah.", max_output_tokens: 64, text: {
    format: { type: "json_schema", name: "person", strict: true, schema: {
      type: "object", properties: { name: { type: "string", maxLength: 12 }, old: { type: "boolean" } },
      required: ["name", "old"], additionalProperties: false } } } });
  return { text: r.output_text, status: r.status };
});
await run("chat_format", async () => {
  const r = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Describe Noah." }],
    max_tokens: 64, response_format: { type: "json_schema", json_schema: { name: "person", strict: true, schema: {
      type: "object", properties: { name: { type: "string", maxLength: 12 }, old: { type: "boolean" } },
      required: ["name", "old"], additionalProperties: false } } } });
  return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason };
});

// ---- the AI SDK ----
const openai = createOpenAI({ baseURL: base + "/v1", apiKey });
const compat = createOpenAICompatible({ name: "baton", baseURL: base + "/v1", apiKey });
const weather = tool({ description: "The weather in a city", inputSchema: z.object({ city: z.string() }),
                       execute: async ({ city }) => "Sunny in " + city });
for (const [name, m] of [["default", openai(model)], ["chat", openai.chat(model)], ["compatible", compat(model)]]) {
  await run("ai_text_" + name, async () => {
    const r = await generateText({ model: m, prompt: "Tell me of light.", maxOutputTokens: 12, temperature: 0 });
    return { text: r.text, finish: r.finishReason, usage: { input: r.usage.inputTokens, output: r.usage.outputTokens } };
  });
  await run("ai_stream_" + name, async () => {
    const r = streamText({ model: m, prompt: "Tell me of light.", maxOutputTokens: 12, temperature: 0 });
    let text = "", parts = 0;
    for await (const t of r.textStream) { text += t; parts++; }
    return { text, parts, finish: await r.finishReason };
  });
  await run("ai_tools_" + name, async () => {
    const r = await generateText({ model: m, prompt: "What is the weather in Paris?", tools: { get_weather: weather },
                                   stopWhen: stepCountIs(2), maxOutputTokens: 160 });
    const s0 = r.steps[0];
    return { steps: r.steps.length, calls: s0.toolCalls.map((c) => ({ name: c.toolName, input: c.input })),
             results: s0.toolResults.map((t) => t.output), finish0: s0.finishReason };
  });
  await run("ai_stream_tools_" + name, async () => {
    const r = streamText({ model: m, prompt: "What is the weather in Paris?", tools: { get_weather: weather },
                           stopWhen: stepCountIs(2), maxOutputTokens: 160 });
    const parts = [];
    for await (const p of r.fullStream) if (p.type === "tool-call" || p.type === "tool-result") parts.push(p.type);
    const steps = await r.steps;
    return { parts, steps: steps.length, calls: steps[0].toolCalls.map((c) => ({ name: c.toolName, input: c.input })) };
  });
  await run("ai_object_" + name, async () => {
    const r = await generateObject({ model: m, schema: person, prompt: "Describe Noah.", maxOutputTokens: 64 });
    return { object: r.object, finish: r.finishReason };
  });
}

// ---- LangChain ----
for (const [name, useResponsesApi] of [["chat", false], ["responses", true]]) {
  const opts = { model, apiKey, configuration: { baseURL: base + "/v1" }, temperature: 0, maxRetries: 0, useResponsesApi };
  const llm = new ChatOpenAI({ ...opts, maxTokens: 64 });
  const llmTools = new ChatOpenAI({ ...opts, maxTokens: 160 }); // a call: see responses_tools
  await run("lc_invoke_" + name, async () => {
    const m = await llm.invoke("Tell me of light.");
    return { text: typeof m.content === "string" ? m.content : m.text };
  });
  await run("lc_tools_" + name, async () => {
    const getWeather = lcTool(async ({ city }) => "Sunny in " + city, { name: "get_weather",
      description: "The weather in a city", schema: z.object({ city: z.string() }) });
    const m = await llmTools.bindTools([getWeather]).invoke("What is the weather in Paris?");
    return { calls: m.tool_calls.map((c) => ({ name: c.name, args: c.args })) };
  });
  await run("lc_structured_" + name, async () => {
    const o = await llm.withStructuredOutput(person, { name: "person" }).invoke("Describe Noah.");
    return { object: o };
  }, true);
}

console.log(JSON.stringify(out));
