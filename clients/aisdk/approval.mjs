// An approval through turnmesh's /v1/responses with the Vercel AI SDK's
// openai.responses() and its defaults (store: true): the agent's
// mcp_approval_request is a tool-approval-request part; a
// tool-approval-response answers it. Usage: node approval.mjs BASE_URL MODEL
// MCP_URL APPROVE; prints each turn's text, the approval request and every
// request body the SDK sent, as JSON.
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, streamText } from "ai";

const [baseURL, model, serverUrl, approve] = process.argv.slice(2);
const sent = [];
const openai = createOpenAI({
  baseURL,
  apiKey: "unused",
  fetch: async (url, init) => {
    sent.push(JSON.parse(init.body));
    return fetch(url, init);
  },
});
// The SDK's way to say "this server's approvals are mine to answer".
const tools = { demo: openai.tools.mcp({ serverLabel: model, serverUrl, requireApproval: "always" }) };

const messages = [{ role: "user", content: "What is 6*7, with approval?" }];
const first = await generateText({ model: openai.responses(model), messages, tools });
const request = first.content.find((part) => part.type === "tool-approval-request");
const call = first.content.find((part) => part.type === "tool-call");
messages.push(...first.response.messages, {
  role: "tool",
  content: [
    {
      type: "tool-approval-response",
      approvalId: request.approvalId,
      approved: approve === "yes",
      // As the SDK's own UI messages mark an answer to a provider-executed
      // call (what the SDK makes of an mcp_approval_request): sent to the model.
      providerExecuted: true,
    },
  ],
});
// The answer streams.
const second = streamText({ model: openai.responses(model), messages, tools });
let streamed = "";
for await (const delta of second.textStream) streamed += delta;
console.log(
  JSON.stringify({ texts: [first.text, streamed], request, call: call && call.toolName, sent }),
);
