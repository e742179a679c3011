"""MCP authorization end to end: the official MCP Python SDK's OAuth client, handed no token, meets the
gateway's 401, reads its protected resource metadata, finds the OpenID provider there (npm
oidc-provider, tests/oidc/provider.mjs), registers itself, runs the authorization-code flow with PKCE
and a resource indicator, while a scripted browser signs in as alice and consents; then it lists and
calls tools at /mcp with the provider's token, which the database verifies against the provider's
JWKS (written by `ctxguard-gateway jwks-sync`). Run by tests/oidc/run.sh."""

import asyncio
import base64
import json
import os
import re
from urllib.parse import parse_qs, urljoin, urlparse

import httpx2
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

GW = os.environ["CTXGUARD_OIDC_GW"]
ISSUER = os.environ["CTXGUARD_OIDC_ISSUER"]
# Never listened on: the scripted browser stops at the redirect to it and hands the code over.
REDIRECT = "http://127.0.0.1:9/callback"
PAGE = {"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}


class Memory:
    """Token storage in memory: nothing is handed to the client beforehand."""

    def __init__(self):
        self.tokens = None
        self.client_info = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class Browser:
    """A scripted user agent: follows the provider's redirects, submits its sign-in form as alice and
    its consent form, and stops at the redirect back to the client."""

    def __init__(self):
        self.steps = []
        self.result = None

    async def visit(self, url: str) -> None:
        assert url.startswith(ISSUER + "/"), url
        query = parse_qs(urlparse(url).query)
        assert query["code_challenge_method"] == ["S256"] and query["code_challenge"], "PKCE"
        assert query["resource"] == [f"{GW}/mcp"], query.get("resource")
        async with httpx2.AsyncClient(timeout=20) as http:
            method, data = "GET", None
            for _ in range(20):
                r = await http.request(method, url, data=data)
                if r.status_code in (302, 303):
                    url = urljoin(url, r.headers["location"])
                    method, data = "GET", None
                    if url.startswith(REDIRECT):
                        q = parse_qs(urlparse(url).query)
                        assert "error" not in q, q
                        self.result = AuthorizationCodeResult(
                            code=q["code"][0], state=q["state"][0], iss=q.get("iss", [None])[0]
                        )
                        return
                    continue
                assert r.status_code == 200, (r.status_code, r.text[:200])
                action = re.search(r'<form method="post" action="([^"]+)"', r.text).group(1)
                step = action.rsplit("/", 1)[1]
                self.steps.append(step)
                url, method = urljoin(url, action), "POST"
                data = {"login": "alice"} if step == "login" else {}
            raise AssertionError(f"no redirect back to the client after {self.steps}")

    async def callback(self) -> AuthorizationCodeResult:
        assert self.result is not None
        return self.result


def page_header(page):
    return base64.urlsafe_b64encode(json.dumps(page).encode()).decode().rstrip("=")


def claims(token):
    part = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


async def main():
    # Without a token: 401 with the RFC 6750 / RFC 9728 challenge, and metadata naming the provider.
    async with httpx2.AsyncClient(timeout=20) as http:
        r = await http.post(f"{GW}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                            headers={"accept": "application/json, text/event-stream"})
        assert r.status_code == 401, r.status_code
        challenge = r.headers["www-authenticate"]
        assert challenge.startswith("Bearer "), challenge
        assert 'scope="ctxguard"' in challenge, challenge
        metadata_url = re.search(r'resource_metadata="([^"]+)"', challenge).group(1)
        prm = (await http.get(metadata_url)).json()
        assert prm["resource"] == f"{GW}/mcp", prm
        assert prm["authorization_servers"] == [ISSUER], prm
        assert prm["scopes_supported"] == ["ctxguard"], prm

    storage, browser = Memory(), Browser()
    auth = OAuthClientProvider(
        server_url=f"{GW}/mcp",
        client_metadata=OAuthClientMetadata(
            client_name="ctxguard e2e", redirect_uris=[REDIRECT], grant_types=["authorization_code"],
            response_types=["code"], token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=browser.visit,
        callback_handler=browser.callback,
    )
    http = httpx2.AsyncClient(auth=auth, headers={"X-Ctxguard-Page": page_header(PAGE)}, timeout=30)
    async with http:
        async with Client(streamable_http_client(f"{GW}/mcp", http_client=http), mode="legacy") as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert "invoice__get" in names, names
            result = await client.call_tool("invoice__get", {})
            assert not result.is_error, result
            assert result.structured_content["id"] == "acme_inv3", result.structured_content

    assert browser.steps == ["login", "confirm"], browser.steps
    assert storage.client_info is not None and storage.client_info.client_id, "registered dynamically"
    token = storage.tokens.access_token
    c = claims(token)
    assert c["iss"] == ISSUER and c["aud"] == f"{GW}/mcp" and c["sub"] == "alice", c
    assert c["https://ctxguard.test/tenant"] == "acme", c
    print(f"ok: MCP OAuth end to end ({' -> '.join(browser.steps)}), tools listed and called as alice")


asyncio.run(main())
