// The Vercel AI SDK (ai 6) with the provider its argument names, each with its defaults: `openai` (the
// Responses API, store on: later requests send item references), `openai-chat` (chat completions),
// `anthropic` (the Messages API); OPENAI_BASE_URL / ANTHROPIC_BASE_URL and their keys from the environment.
// A tool loop of up to five steps; the answer is printed as the last line (JSON), as the agent environment reads.
import { anthropic } from "@ai-sdk/anthropic";
import { openai } from "@ai-sdk/openai";
import { generateText, stepCountIs, tool } from "ai";
import { z } from "zod";

const models = {
  openai: () => openai("policy"),
  "openai-chat": () => openai.chat("policy"),
  anthropic: () => anthropic("policy"),
};

// The model's expression is untrusted: numbers and + - * / ( ) only, parsed here, never eval()'d.
function calculate(expression) {
  const tokens = expression.match(/\d+(\.\d+)?|[-+*/()]|\S/g) ?? [];
  let at = 0;
  const next = () => tokens[at++];
  const peek = () => tokens[at];
  function atom() {
    const token = next();
    if (token === "(") {
      const value = sum();
      if (next() !== ")") throw new Error("unbalanced parentheses");
      return value;
    }
    if (token === "-") return -atom();
    if (token !== undefined && /^\d/.test(token)) return Number(token);
    throw new Error("only numbers and + - * / are allowed");
  }
  function product() {
    let value = atom();
    while (peek() === "*" || peek() === "/") value = next() === "*" ? value * atom() : value / atom();
    return value;
  }
  function sum() {
    let value = product();
    while (peek() === "+" || peek() === "-") value = next() === "+" ? value + product() : value - product();
    return value;
  }
  try {
    const value = sum();
    if (at !== tokens.length) throw new Error("only numbers and + - * / are allowed");
    return String(value);
  } catch (error) {
    return `error: ${error.message}`;
  }
}

const question = process.env.TOOLRL_QUESTION ?? JSON.parse(process.env.TOOLRL_TASK).question;
const result = await generateText({
  model: models[process.argv[2]](),
  system: "Use the calculator.",
  prompt: question,
  tools: {
    calculator: tool({
      description: "Evaluate an arithmetic expression.",
      inputSchema: z.object({ expression: z.string() }),
      execute: async ({ expression }) => calculate(expression),
    }),
  },
  stopWhen: stepCountIs(5),
});
console.log(JSON.stringify(result.text));
