"""Print the tools/list result an MCP client receives on one page, as JSON (bench/mcp_tokens.sh).

    mcp_list.py GATEWAY_URL TOKEN PAGE_JSON
"""

import base64
import json
import sys

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


async def main(url, token, page):
    header = base64.urlsafe_b64encode(page.encode()).decode().rstrip("=")
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}", "X-Ctxguard-Page": header})
    async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http), mode="legacy") as client:
        result = await client.list_tools()
    tools = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in result.tools]
    print(json.dumps({"tools": tools}))


anyio.run(main, *sys.argv[1:4])
