// The official MCP TypeScript SDK (@modelcontextprotocol/sdk, protocol 2025-11-25: a session) as a
// client of the gateway's /mcp on a page over the tool budget (issue 31): the compact list, a
// search, and a found tool called directly. Run by tests/mcp/test_mcp.py with
//   node ts_client.mjs <gateway URL> <token> <page JSON>
// and the SDK's directory in CTXGUARD_TS_SDK. Prints one JSON line of what it saw; the Python
// test asserts on it.
const [url, token, page] = process.argv.slice(2);
const sdk = process.env.CTXGUARD_TS_SDK;
const { Client } = await import(`${sdk}/dist/esm/client/index.js`);
const { StreamableHTTPClientTransport } = await import(`${sdk}/dist/esm/client/streamableHttp.js`);

const headers = { Authorization: `Bearer ${token}`, "X-Ctxguard-Page": page };
const client = new Client({ name: "ctxguard-ts-test", version: "1.0.0" });
const transport = new StreamableHTTPClientTransport(new URL(`${url}/mcp`), { requestInit: { headers } });
await client.connect(transport);

const first = await client.listTools();
const second = await client.listTools();
const search = await client.callTool({ name: "find_tools", arguments: { query: "read the scanned invoice page", namespace: "scans" } });
const found = search.structuredContent?.tools ?? [];
const scan = found.find((t) => t.name === "scans__read_scan");
const called = scan ? await client.callTool({ name: scan.name, arguments: { page: 1 } }) : null;
const ghost = await client.callTool({ name: "find_tools", arguments: { query: "untagged search of every scan" } });
const after = await client.listTools();

console.log(JSON.stringify({
  protocol: transport.protocolVersion ?? null,
  session: transport.sessionId ? true : false,
  names: first.tools.map((t) => t.name),
  same: JSON.stringify(first.tools) === JSON.stringify(second.tools)
    && JSON.stringify(first.tools) === JSON.stringify(after.tools),
  findDescription: first.tools.find((t) => t.name === "find_tools")?.description ?? null,
  found: found.map((t) => t.name),
  foundHasSchema: found.every((t) => t.inputSchema && t.inputSchema.type === "object"),
  called: called ? { isError: called.isError ?? false, text: called.content?.[0]?.text ?? "" } : null,
  ghost: (ghost.structuredContent?.tools ?? []).map((t) => t.name),
}));
await client.close();
