"""An upstream MCP server of 100 tools (official Python SDK, Streamable HTTP) for
bench/disclosure_tokens.sh: ten verbs on ten objects of one product, each tool with a one-sentence
description and typed parameters, as real servers (a code host, a file drive) publish them.

    upstream_catalog.py PORT github|drive
"""

import sys

from mcp.server.mcpserver import MCPServer

PRODUCTS = {
    "github": ("repository", ["issues", "pull_requests", "branches", "commits", "releases", "workflows",
                              "labels", "milestones", "gists", "discussions"],
               ["list", "get", "create", "update", "close", "search", "comment", "assign", "label", "archive"]),
    "drive": ("drive", ["files", "folders", "permissions", "comments", "revisions", "shared_drives",
                        "labels", "exports", "uploads", "trash"],
              ["list", "get", "create", "update", "delete", "move", "copy", "share", "search", "download"]),
}

port, product = int(sys.argv[1]), sys.argv[2]
where, objects, verbs = PRODUCTS[product]
server = MCPServer(f"bench-{product}")


def make(verb, obj):
    def tool(owner: str, name: str, query: str = "", limit: int = 20) -> str:
        return f"{verb} {obj} of {owner}/{name}"
    return tool


for obj in objects:
    for verb in verbs:
        label = obj.replace("_", " ")
        server.add_tool(make(verb, obj), name=f"{verb}_{obj}",
                        description=f"{verb.capitalize()} {label} of a {where} (owner and name); "
                                    f"query filters, limit caps the results.")

import uvicorn  # noqa: E402

uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")
