// A frontend tool loop with the real AG-UI client: the first run declares
// the tool `confirm_booking` and names it, so the agent calls it and the run
// ends with the call pending; the app adds the tool's result as a `tool`
// message and runs again. Prints what it saw as JSON.
// Usage: node tool-loop.mjs URL THREAD_ID RESULT
import { HttpAgent } from "@ag-ui/client";
import { errorText, recorder } from "./_record.mjs";

const [url, threadId, result] = process.argv.slice(2);
const tools = [
  {
    name: "confirm_booking",
    description: "Asks the user to confirm the booking in the browser",
    parameters: { type: "object", properties: { input: { type: "string" } } },
  },
];
const agent = new HttpAgent({
  url,
  threadId,
  initialMessages: [{ id: "u1", role: "user", content: "Please confirm_booking: two at 8pm" }],
});
const output = { runs: [] };
try {
  const first = recorder(output.runs);
  first.run.newMessages = (await agent.runAgent({ runId: "run-1", tools }, first.subscriber)).newMessages;
  for (const id of first.run.finished.pendingToolCallIds) {
    agent.addMessage({ id: `tool-${id}`, role: "tool", toolCallId: id, content: result });
  }
  const second = recorder(output.runs);
  second.run.newMessages = (await agent.runAgent({ runId: "run-2", tools }, second.subscriber)).newMessages;
} catch (error) {
  output.error = errorText(error);
}
output.messages = agent.messages;
console.log(JSON.stringify(output));
