// Starts a run on the probe agent and calls abortRun() at its first text
// delta, as a UI's stop button does; prints what it saw as JSON.
// Usage: node abort.mjs URL THREAD_ID MESSAGE [ON_DISCONNECT]
import { HttpAgent } from "@ag-ui/client";

import { errorText } from "./_record.mjs";

const [url, threadId, message, onDisconnect] = process.argv.slice(2);
const agent = new HttpAgent({
  url,
  threadId,
  headers: onDisconnect ? { "X-Turnmesh-On-Disconnect": onDisconnect } : {},
  initialMessages: [{ id: "u1", role: "user", content: message }],
});
const output = { events: [], aborted: false };
const subscriber = {
  onEvent({ event }) {
    output.events.push(event.type);
    if (event.type === "TEXT_MESSAGE_CONTENT" && !output.aborted) {
      output.aborted = true;
      agent.abortRun();
    }
  },
};
try {
  await agent.runAgent({ runId: "run-1", forwardedProps: { agent: "probe" } }, subscriber);
} catch (error) {
  output.error = errorText(error);
}
console.log(JSON.stringify(output));
