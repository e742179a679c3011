"""An upstream MCP server that authenticates its callers itself (issue 33's tests), built with the
official Python SDK (MCPServer).

    whoami_server.py PORT LOGDIR

A request's bearer token must be one of the tenant secrets in $WHOAMI_SECRETS
("tenant=secret,tenant=secret"), or, with $WHOAMI_ISSUER set, a JWT that authorization server
signed (its JWKS) for this server's URL as audience: anything else is answered 401 before MCP
sees it. The tool `whoami` answers whose credential the call carried. Every Authorization header is appended to
LOGDIR/auth.log, so the tests prove which credential each call carried.
"""

import os
import sys
from pathlib import Path

import uvicorn
from mcp.server.mcpserver import Context, MCPServer

port, logdir = int(sys.argv[1]), Path(sys.argv[2])
logdir.mkdir(parents=True, exist_ok=True)
SECRETS = dict(pair.split("=", 1) for pair in os.environ.get("WHOAMI_SECRETS", "").split(",") if pair)
BY_SECRET = {secret: f"tenant {tenant}" for tenant, secret in SECRETS.items()}
ISSUER = os.environ.get("WHOAMI_ISSUER")
AUDIENCE = f"http://127.0.0.1:{port}/mcp"


def identify(token: str):
    """Whose credential `token` is, or None."""
    if token in BY_SECRET:
        return BY_SECRET[token]
    if not ISSUER:
        return None
    import jwt

    try:
        key = jwt.PyJWKClient(f"{ISSUER}/jwks").get_signing_key_from_jwt(token)
        claims = jwt.decode(token, key.key, algorithms=["ES256"], audience=AUDIENCE, issuer=ISSUER)
    except Exception:
        return None
    return f"{claims['sub']} of {claims.get('tenant')}"
server = MCPServer("ctxguard-whoami")


@server.tool()
def whoami(ctx: Context) -> str:
    """Say whose credential this call carried."""
    request = ctx.request_context.request
    auth = request.headers.get("authorization", "") if request is not None else ""
    return f"you are {identify(auth.removeprefix('Bearer '))}"


app = server.streamable_http_app()


async def guarded(scope, receive, send):
    if scope["type"] != "http":
        return await app(scope, receive, send)
    auth = dict(scope["headers"]).get(b"authorization", b"").decode()
    with open(logdir / "auth.log", "a") as f:
        f.write(auth + "\n")
    who = identify(auth.removeprefix("Bearer ")) if auth.startswith("Bearer ") else None
    if who is None:
        await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"unauthorized"})
        return
    await app(scope, receive, send)


uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning")
