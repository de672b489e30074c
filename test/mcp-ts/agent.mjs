// A coding agent's task, scripted, through the official TypeScript MCP
// client on quro's default tool profile (driven by internal/api/mcp's
// TestScriptedAgentTask): a small Python project — a CSV, its statistics,
// a table, a chart, a test fixed with edit_file, a background web server
// and its log, an interactive prompt, two commands sent at once, and a run
// that outgrows the session's memory.
//
//   node agent.mjs URL
//
// It prints one JSON object on stdout: {tools: [names listed], steps:
// {step: {text, types, mimeTypes, isError}}}, where text is every text
// content of the result joined, types the content types in order and
// mimeTypes those of image contents. The Go test judges what a model would
// read; this script only acts as the agent would.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url] = process.argv.slice(2);
const client = new Client({ name: "quro-scripted-agent", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));

const tools = [];
let cursor;
do {
  const page = await client.listTools(cursor ? { cursor } : undefined);
  tools.push(...page.tools.map((t) => t.name));
  cursor = page.nextCursor;
} while (cursor);

const steps = {};
function record(result) {
  if (result.protocolError) return result;
  const content = result.content || [];
  return {
    text: content.filter((c) => c.type === "text").map((c) => c.text).join("\n"),
    types: content.map((c) => c.type),
    mimeTypes: content.filter((c) => c.type === "image").map((c) => c.mimeType),
    isError: Boolean(result.isError),
  };
}
async function call(name, args) {
  try {
    return record(await client.callTool({ name, arguments: args }, undefined, { timeout: 180_000 }));
  } catch (err) {
    return { protocolError: String(err && err.message ? err.message : err) };
  }
}
async function step(key, name, args) {
  steps[key] = await call(name, args);
}

await step("write_csv", "write_file", { path: "/home/user/stats/data.csv", content: "x,y\n1,2\n2,4\n3,7\n" });
await step("stats", "run_code", {
  code: [
    "import csv, statistics",
    "rows = list(csv.DictReader(open('stats/data.csv')))",
    "ys = [float(r['y']) for r in rows]",
    "print(f'mean y = {statistics.mean(ys):.2f}')",
  ].join("\n"),
});
// A table as notebooks show one: HTML, with its text beside it.
await step("table", "run_code", {
  code: [
    "class Table:",
    "    def _repr_html_(self): return '<table><tr><td>mean</td><td>4.33</td></tr></table>'",
    "    def __repr__(self): return 'mean    4.33'",
    "Table()",
  ].join("\n"),
});
await step("chart", "run_code", {
  lang: "svg",
  code: '<svg xmlns="http://www.w3.org/2000/svg" width="60" height="40"><rect x="5" y="5" width="20" height="30" fill="steelblue"/></svg>',
});
// A PNG the project wrote, read back as a model would look at it.
await step("png_write", "run_code", {
  code: [
    "import struct, zlib",
    "def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))",
    "raw = b''.join(b'\\x00' + b'\\xff\\x00\\x00' * 8 for _ in range(8))",
    "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 8, 8, 8, 2, 0, 0, 0)) + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b'')",
    "open('stats/chart.png', 'wb').write(png)",
    "print('wrote', len(png))",
  ].join("\n"),
});
await step("png_read", "read_file", { path: "stats/chart.png" });
await step("test_write", "write_file", {
  path: "stats/test_stats.py",
  content: "def mean(xs):\n    return sum(xs) / (len(xs) + 1)\n\nassert mean([2, 4, 7]) == 13 / 3, mean([2, 4, 7])\nprint('tests pass')\n",
});
await step("test_fail", "terminal_exec", { command: "cd stats && python3 test_stats.py" });
await step("edit", "edit_file", {
  command: "str_replace", path: "/home/user/stats/test_stats.py",
  old_str: "return sum(xs) / (len(xs) + 1)", new_str: "return sum(xs) / len(xs)",
});
await step("view", "edit_file", { command: "view", path: "stats/test_stats.py", view_range: [1, 2] });
await step("test_pass", "terminal_exec", { command: "python3 test_stats.py && pwd" });
// Two commands in one turn, as clients send parallel tool calls.
const [one, two] = await Promise.all([
  call("terminal_exec", { command: "python3 -c 'import time; time.sleep(0.5)'; echo one" }),
  call("terminal_exec", { command: "echo two" }),
]);
steps.parallel_one = one;
steps.parallel_two = two;
await step("server", "start_process", { command: "python3 -m http.server 8765 --bind 127.0.0.1", background: true, tag: "web" });
// The agent checks its server as it would: a request from the session,
// retried while the server starts listening — until it listens, not a
// fixed count of tries (100 tries, 10 s, can be less than a Python's start
// at a load of 40); the 2 minutes only end a server that never comes,
// within the command's own budget.
await step("fetch", "terminal_exec", {
  command: "python3 -c \"import time, urllib.request\nend = time.monotonic() + 120\nwhile True:\n    try: print(urllib.request.urlopen('http://127.0.0.1:8765/stats/data.csv').read().decode()); break\n    except urllib.error.URLError as e:\n        if getattr(e, 'code', None) or time.monotonic() > end: raise\n        time.sleep(0.1)\"",
  timeout_ms: 150_000,
});
await step("server_log", "read_process_output", { tag: "web" });
await step("prompt", "terminal_exec", { command: "python3 -c 'print(\"hi\", input(\"name? \"))'" });
await step("answer", "send_input", { data: "quro\n" });
await step("prompt_again", "terminal_exec", { command: "read -p 'continue? ' yn" });
await step("moved_on", "terminal_exec", { command: "echo moved on" });
// The budget is the work's, sized for a loaded machine: before the kill
// the kernel reclaims what it can of the box (the page cache, the
// worker's and the server's code, read back as they run), for which
// run_code's default 30 s can be too little at a load of 40 — and a run
// cut at its budget says "timed out", not the memory limit.
await step("oom", "run_code", { code: "b = bytearray(600 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('allocated')", timeout_ms: 150_000 });
await step("after_oom", "run_code", { code: "print('still here')" });

await client.close();
console.log(JSON.stringify({ tools, steps }));
