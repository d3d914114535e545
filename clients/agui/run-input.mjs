// One run from a fresh client (as after a page reload), its input given as
// JSON on stdin: {threadId, runId, messages, tools?, resume?}. Prints what it
// saw as JSON; a refused request is `error` ("HTTP <status>: <body>").
// Usage: node run-input.mjs URL < input.json
import { readFileSync } from "node:fs";
import { HttpAgent } from "@ag-ui/client";
import { errorText, recorder } from "./_record.mjs";

const [url] = process.argv.slice(2);
const input = JSON.parse(readFileSync(0, "utf8"));
const agent = new HttpAgent({ url, threadId: input.threadId, initialMessages: input.messages });
const output = { runs: [] };
const { run, subscriber } = recorder(output.runs);
try {
  const parameters = { runId: input.runId, tools: input.tools ?? [] };
  if (input.resume !== undefined) parameters.resume = input.resume;
  run.newMessages = (await agent.runAgent(parameters, subscriber)).newMessages;
} catch (error) {
  output.error = errorText(error);
}
output.messages = agent.messages;
console.log(JSON.stringify(output));
