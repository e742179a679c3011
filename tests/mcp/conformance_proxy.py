"""A small HTTP proxy for the MCP conformance suite, which cannot send headers: it adds the
Authorization and X-Ctxguard-Page headers to every request and forwards it to the gateway untouched
otherwise (Host and Origin included, so the suite's DNS-rebinding checks reach the gateway's).

Each connection carries one request (`Connection: close`), so that every request gets the headers.
Usage: conformance_proxy.py LISTEN_PORT UPSTREAM_PORT  (TOKEN and PAGE from the environment)
"""

import asyncio
import os
import sys

LISTEN, UPSTREAM = int(sys.argv[1]), int(sys.argv[2])
ADDED = [f"Authorization: Bearer {os.environ['TOKEN']}", f"X-Ctxguard-Page: {os.environ['PAGE']}",
         "Connection: close"]
DROPPED = {b"authorization", b"x-ctxguard-page", b"connection", b"keep-alive"}


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def handle(client_r, client_w):
    try:
        head = await client_r.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        client_w.close()
        return
    lines = head[:-4].split(b"\r\n")
    kept = [lines[0]] + [h for h in lines[1:] if h.split(b":", 1)[0].strip().lower() not in DROPPED]
    head = b"\r\n".join(kept + [h.encode() for h in ADDED]) + b"\r\n\r\n"
    up_r, up_w = await asyncio.open_connection("127.0.0.1", UPSTREAM)
    up_w.write(head)
    await up_w.drain()
    await asyncio.gather(pipe(client_r, up_w), pipe(up_r, client_w))


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", LISTEN)
    print(f"proxy on {LISTEN}", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
