// Counts the tokens a model reads of quro's MCP tools, with the official
// TypeScript MCP client and gpt-tokenizer's o200k encoding (driven by
// internal/api/mcp's TestToolTokenBudget; bench/README.md's figures):
//
//   node tokens.mjs --http URL PROFILE...         (each profile as URL?tools=PROFILE)
//   node tokens.mjs -- COMMAND ARGS...            (stdio: the profile COMMAND lists)
//
// For each profile it prints the tools listed, the tokens of their
// definitions as a model API receives them (name, description and input
// schema: the JSON of [{name, description, input_schema}]), the tokens of
// the whole tools/list result (output schemas and annotations too), and
// the tokens of help's answer without a topic. One JSON object on stdout:
// {PROFILE: {tools: [names], definitions, list, help}}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { countTokens } from "gpt-tokenizer/encoding/o200k_base";

const [mode, ...rest] = process.argv.slice(2);

async function measure(transport) {
  const client = new Client({ name: "quro-token-count", version: "1.0.0" });
  await client.connect(transport);
  const tools = [];
  let cursor;
  do {
    const page = await client.listTools(cursor ? { cursor } : undefined);
    tools.push(...page.tools);
    cursor = page.nextCursor;
  } while (cursor);
  const definitions = tools.map((t) => ({ name: t.name, description: t.description, input_schema: t.inputSchema }));
  const help = await client.callTool({ name: "help", arguments: {} });
  const helpText = help.content.filter((c) => c.type === "text").map((c) => c.text).join("\n");
  await client.close();
  return {
    tools: tools.map((t) => t.name),
    definitions: countTokens(JSON.stringify(definitions)),
    list: countTokens(JSON.stringify({ tools })),
    help: countTokens(helpText),
  };
}

const out = {};
if (mode === "--http") {
  const [url, ...profiles] = rest;
  for (const p of profiles) {
    const u = new URL(url);
    u.searchParams.set("tools", p);
    out[p] = await measure(new StreamableHTTPClientTransport(u));
  }
} else if (mode === "--") {
  out.stdio = await measure(new StdioClientTransport({ command: rest[0], args: rest.slice(1), stderr: "inherit" }));
} else {
  console.error("usage: node tokens.mjs (--http URL PROFILE... | -- COMMAND ARGS...)");
  process.exit(2);
}
process.stdout.write(JSON.stringify(out) + "\n");
