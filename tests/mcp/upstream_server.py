"""An upstream MCP server built with the official Python SDK (MCPServer, formerly FastMCP).

    upstream_server.py http PORT LOGDIR    # Streamable HTTP at http://127.0.0.1:PORT/mcp
    upstream_server.py stdio LOGDIR        # stdio

Every tool call is appended to LOGDIR/calls.jsonl (read_scan's also, with the `traceparent` of its
`_meta`, to LOGDIR/traceparents.jsonl) and, over HTTP, every Authorization header to LOGDIR/auth.log,
so the tests can prove what ctxguard forwarded and what it did not.
"""

import json
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer

mode = sys.argv[1]
logdir = Path(sys.argv[-1])
logdir.mkdir(parents=True, exist_ok=True)
server = MCPServer("ctxguard-test-upstream")


def record(tool: str, ctx: Context | None = None, **args) -> None:
    with open(logdir / "calls.jsonl", "a") as f:
        f.write(json.dumps({"tool": tool, "args": args}) + "\n")
    if ctx is not None:
        # The W3C trace context the client sent in the request's `_meta` (MCP 2026-07-28).
        meta = ctx.request_context.meta or {}
        with open(logdir / "traceparents.jsonl", "a") as f:
            f.write(json.dumps({"tool": tool, "args": args, "traceparent": meta.get("traceparent")}) + "\n")


@server.tool()
def read_scan(invoice_id: str, ctx: Context, page: int = 1) -> str:
    """Read one page of the scanned PDF of an invoice."""
    record("read_scan", ctx, invoice_id=invoice_id, page=page)
    return f"Scan of {invoice_id}, page {page}: paid by card 4111 1111 1111 1111, contact jane.doe@example.com."


@server.tool()
def untagged_search(q: str) -> str:
    """Search every scan of every customer (no entity binding possible)."""
    record("untagged_search", q=q)
    return f"results for {q}"


@server.tool()
def lookup_note(topic: str) -> str:
    """Look up an internal note by topic."""
    record("lookup_note", topic=topic)
    return f"Note on {topic}: call the vendor before paying."


if mode == "stdio":
    server.run("stdio")
else:
    import uvicorn

    app = server.streamable_http_app()

    async def logged(scope, receive, send):
        if scope["type"] == "http":
            auth = dict(scope["headers"]).get(b"authorization", b"").decode()
            with open(logdir / "auth.log", "a") as f:
                f.write(auth + "\n")
        await app(scope, receive, send)

    uvicorn.run(logged, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
