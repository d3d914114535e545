// A paused assistant message that also ran one of the agent's own tools,
// with the real AG-UI client (agent "probe", whose "mixed calls" and "mixed
// approval" messages make one): the client keeps that tool's result among
// its messages; the next run answers the pause (a frontend tool's result,
// or an approval) and must be taken. Prints what it saw as JSON.
// Usage: node mixed.mjs URL THREAD_ID calls|approval
import { HttpAgent, buildResumeArray } from "@ag-ui/client";
import { errorText, recorder } from "./_record.mjs";

const [url, threadId, mode] = process.argv.slice(2);
const agent = new HttpAgent({
  url,
  threadId,
  initialMessages: [{ id: "u1", role: "user", content: `mixed ${mode}` }],
});
const tools = [{ name: "get_weather", description: "frontend", parameters: { type: "object" } }];
const forwardedProps = { agent: "probe" };
const output = { runs: [] };
try {
  const first = recorder(output.runs);
  await agent.runAgent({ runId: "run-1", tools, forwardedProps }, first.subscriber);
  output.sent = agent.messages.map((m) => ({ role: m.role, toolCallId: m.toolCallId ?? null }));
  const second = recorder(output.runs);
  if (mode === "approval") {
    const resume = buildResumeArray(
      agent.pendingInterrupts,
      Object.fromEntries(
        agent.pendingInterrupts.map((i) => [i.id, { status: "resolved", payload: { approved: true } }]),
      ),
    );
    await agent.runAgent({ runId: "run-2", tools, forwardedProps, resume }, second.subscriber);
  } else {
    for (const id of first.run.finished.pendingToolCallIds ?? []) {
      agent.addMessage({ id: `t-${id}`, role: "tool", toolCallId: id, content: "sunny" });
    }
    await agent.runAgent({ runId: "run-2", tools, forwardedProps }, second.subscriber);
  }
} catch (error) {
  output.error = errorText(error);
}
console.log(JSON.stringify(output));
