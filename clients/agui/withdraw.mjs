// An interrupt that ends before the client answers it (its turn cancelled,
// or its pause expired), with the real AG-UI client: the first run ends with
// outcome "interrupt"; the script prints {"paused": ...} on a line and waits
// for a line on standard input (the test ends the pause meanwhile); then,
// as the client insists, it withdraws every pending interrupt ("cancelled")
// and sends MESSAGE. Prints what it saw as JSON, on the next line.
// Usage: node withdraw.mjs URL THREAD_ID FIRST_MESSAGE MESSAGE
import { createInterface } from "node:readline";
import { HttpAgent, buildResumeArray } from "@ag-ui/client";
import { errorText, recorder } from "./_record.mjs";

const [url, threadId, firstMessage, message] = process.argv.slice(2);
const agent = new HttpAgent({
  url,
  threadId,
  initialMessages: [{ id: "u1", role: "user", content: firstMessage }],
});
const output = { runs: [] };
try {
  const first = recorder(output.runs);
  await agent.runAgent({ runId: "run-1" }, first.subscriber);
  console.log(JSON.stringify({ paused: agent.pendingInterrupts }));
  const lines = createInterface({ input: process.stdin });
  for await (const _ of lines) break;
  lines.close();
  agent.addMessage({ id: "u2", role: "user", content: message });
  const resume = buildResumeArray(
    agent.pendingInterrupts,
    Object.fromEntries(agent.pendingInterrupts.map((i) => [i.id, { status: "cancelled" }])),
  );
  const second = recorder(output.runs);
  await agent.runAgent({ runId: "run-2", resume }, second.subscriber);
  output.pendingAfter = agent.pendingInterrupts;
} catch (error) {
  output.error = errorText(error);
}
console.log(JSON.stringify(output));
