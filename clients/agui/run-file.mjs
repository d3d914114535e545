// Sends one user message with a file attached (an AG-UI 1.0 image or document
// part, bytes inline) with the real AG-UI client, and prints what it saw as
// JSON. Usage: node run-file.mjs URL THREAD_ID FILE MIME_TYPE QUESTION
import { readFileSync } from "node:fs";
import { basename } from "node:path";
import { HttpAgent } from "@ag-ui/client";

const [url, threadId, file, mimeType, question] = process.argv.slice(2);
const part = {
  type: mimeType.startsWith("image/") ? "image" : "document",
  source: { type: "data", value: readFileSync(file).toString("base64"), mimeType },
  metadata: { filename: basename(file) },
};
const agent = new HttpAgent({
  url,
  threadId,
  initialMessages: [{ id: "u1", role: "user", content: [{ type: "text", text: question }, part] }],
});
const seen = [];
const output = {};
try {
  const run = await agent.runAgent({ runId: "run-1" }, {
    onEvent({ event }) {
      seen.push(event);
    },
  });
  output.newMessages = run.newMessages;
} catch (error) {
  output.error = String(error && error.message ? error.message : error);
}
output.events = seen;
console.log(JSON.stringify(output));
