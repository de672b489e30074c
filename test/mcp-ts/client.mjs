// The official TypeScript MCP client against quro, driven by a plan the Go
// test writes (internal/api/mcp/ts_test.go):
//
//   node client.mjs PLAN.json --http URL
//   node client.mjs PLAN.json -- COMMAND ARGS...   (stdio: e.g. quro mcp --data DIR)
//
// PLAN is {"setup": [{name, arguments}], "calls": {tool: arguments}}. The
// client runs the setup calls, lists the tools, calls every listed tool
// with its arguments, and prints one JSON summary on stdout:
// {tools: [{name, outputSchema}], missing: [names without arguments],
//  setup: [result], results: {tool: result}}; a call that failed as a
// protocol error (or that the SDK refused, e.g. structured content that
// does not match the output schema) has {protocolError: message}.
import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [planFile, mode, ...rest] = process.argv.slice(2);
const plan = JSON.parse(readFileSync(planFile, "utf8"));

let transport;
if (mode === "--http") {
  transport = new StreamableHTTPClientTransport(new URL(rest[0]));
} else if (mode === "--") {
  transport = new StdioClientTransport({ command: rest[0], args: rest.slice(1), stderr: "inherit" });
} else {
  console.error("usage: node client.mjs PLAN.json (--http URL | -- COMMAND ARGS...)");
  process.exit(2);
}

const client = new Client({ name: "quro-ts-test", version: "1.0.0" });
await client.connect(transport);

async function call(name, args) {
  try {
    return await client.callTool({ name, arguments: args }, undefined, { timeout: 120_000 });
  } catch (err) {
    return { protocolError: String(err && err.message ? err.message : err) };
  }
}

const summary = { tools: [], missing: [], setup: [], results: {} };
for (const c of plan.setup) {
  summary.setup.push(await call(c.name, c.arguments));
}
let cursor;
do {
  const page = await client.listTools(cursor ? { cursor } : undefined);
  for (const t of page.tools) summary.tools.push({ name: t.name, outputSchema: t.outputSchema });
  cursor = page.nextCursor;
} while (cursor);
for (const t of summary.tools) {
  const args = plan.calls[t.name];
  if (args === undefined) {
    summary.missing.push(t.name);
    continue;
  }
  summary.results[t.name] = await call(t.name, args);
}
await client.close();
process.stdout.write(JSON.stringify(summary) + "\n");
