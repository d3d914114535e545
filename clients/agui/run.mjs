// Runs two turns on one thread against turnmesh's /v1/agui with the real
// AG-UI client (its event verification included) and prints what it saw as
// JSON. Usage: node run.mjs URL THREAD_ID
import { HttpAgent } from "@ag-ui/client";

const [url, threadId] = process.argv.slice(2);
const agent = new HttpAgent({
  url,
  threadId,
  initialMessages: [{ id: "u1", role: "user", content: "What is 12*(3+4)?" }],
});
const seen = [];
const subscriber = {
  onEvent({ event }) {
    seen.push(event.type);
  },
};
const output = { runs: [] };
try {
  const first = await agent.runAgent({ runId: "run-1" }, subscriber);
  output.runs.push({ newMessages: first.newMessages, result: first.result ?? null });
  agent.addMessage({ id: "u2", role: "user", content: "What did I ask first?" });
  const second = await agent.runAgent({ runId: "run-2" }, subscriber);
  output.runs.push({ newMessages: second.newMessages, result: second.result ?? null });
} catch (error) {
  output.error = String(error && error.message ? error.message : error);
}
output.events = seen;
output.messages = agent.messages;
console.log(JSON.stringify(output));
