// An interrupt with the real AG-UI client: the first run ends with
// outcome "interrupt"; a run that does not resume it is refused by the
// client itself; then a run resumes each interrupt with STATUS and PAYLOAD
// (JSON; ignored for "cancelled"). Prints what it saw as JSON.
// Usage: node interrupt.mjs URL THREAD_ID MESSAGE STATUS PAYLOAD
import { HttpAgent, buildResumeArray } from "@ag-ui/client";
import { errorText, recorder } from "./_record.mjs";

const [url, threadId, message, status, payload] = process.argv.slice(2);
const agent = new HttpAgent({
  url,
  threadId,
  initialMessages: [{ id: "u1", role: "user", content: message }],
});
const output = { runs: [] };
try {
  const first = recorder(output.runs);
  first.run.newMessages = (await agent.runAgent({ runId: "run-1" }, first.subscriber)).newMessages;
  output.pendingInterrupts = agent.pendingInterrupts;
  try {
    await agent.runAgent({ runId: "run-unresumed" });
    output.unresumed = "sent";
  } catch (error) {
    output.unresumed = errorText(error);
  }
  const answer = status === "resolved" ? { status, payload: JSON.parse(payload) } : { status };
  const resume = buildResumeArray(
    agent.pendingInterrupts,
    Object.fromEntries(agent.pendingInterrupts.map((i) => [i.id, answer])),
  );
  const second = recorder(output.runs);
  second.run.newMessages = (await agent.runAgent({ runId: "run-2", resume }, second.subscriber)).newMessages;
  output.pendingAfter = agent.pendingInterrupts;
} catch (error) {
  output.error = errorText(error);
}
output.messages = agent.messages;
console.log(JSON.stringify(output));
