// A conversation through turnmesh's /v1/responses with the Vercel AI SDK's
// openai.responses() and its default settings (store: true: earlier answers
// go back as item references). Usage: node run.mjs BASE_URL MODEL; prints
// each turn's text and every request body the SDK sent, as JSON.
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, streamText } from "ai";

const [baseURL, model] = process.argv.slice(2);
const sent = [];
const openai = createOpenAI({
  baseURL,
  apiKey: "unused",
  fetch: async (url, init) => {
    sent.push(JSON.parse(init.body));
    return fetch(url, init);
  },
});

const messages = [{ role: "user", content: "What is 6*7?" }];
const first = await generateText({ model: openai.responses(model), messages });
messages.push(...first.response.messages, { role: "user", content: "what did I ask first?" });
const second = await generateText({ model: openai.responses(model), messages });
messages.push(...second.response.messages, { role: "user", content: "what did I ask before?" });
// The third turn streams.
const third = streamText({ model: openai.responses(model), messages });
let streamed = "";
for await (const delta of third.textStream) streamed += delta;
console.log(JSON.stringify({ texts: [first.text, second.text, streamed], sent }));
