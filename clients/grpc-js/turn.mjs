// Usage: node turn.mjs HOST:PORT MESSAGE
// Creates a session over native gRPC, runs one turn, and prints one JSON line
// per event, then {"history": N}. The protos come from this checkout only.
import path from "node:path";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const definition = protoLoader.loadSync("turnmesh/v1/session_service.proto", {
  includeDirs: [path.join(root, "proto"), path.join(root, "third_party")],
  keepCase: false,
  enums: String,
  defaults: false,
  longs: Number,
});
const { turnmesh } = grpc.loadPackageDefinition(definition);
const [address, message] = process.argv.slice(2);
const client = new turnmesh.v1.SessionService(address, grpc.credentials.createInsecure());

function unary(method, request) {
  return new Promise((resolve, reject) =>
    client[method](request, (error, response) => (error ? reject(error) : resolve(response))),
  );
}

try {
  const { session } = await unary("CreateSession", {});
  const call = client.Turn({ sessionId: session.sessionId, message });
  await new Promise((resolve, reject) => {
    call.on("data", (event) => console.log(JSON.stringify(event)));
    call.on("error", reject);
    call.on("end", resolve);
  });
  const history = await unary("GetHistory", { sessionId: session.sessionId });
  console.log(JSON.stringify({ history: history.messages.length }));
} catch (error) {
  console.error(`${error.code} ${error.details}`);
  process.exitCode = 1;
} finally {
  client.close();
}
