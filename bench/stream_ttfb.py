"""Time to the first answer byte, streamed, against the whole answer (bench/stream_ttfb.sh).

A fake OpenAI-compatible provider streams WORDS text deltas ("word " each), one every INTERVAL_MS,
and notes when it sent the first. The client asks the gateway for a turn streamed
(`Accept: text/event-stream`) and notes when the first `answer_delta` arrives and when `done` does;
then the same turn not streamed (one JSON answer, today's behaviour for every client before
streaming). Prints JSON lines: {"mode", "ttfb_ms", "after_provider_ms", "whole_ms"}.
"""
import http.client
import http.server
import json
import socketserver
import sys
import threading
import time

PROVIDER_PORT, GATEWAY_PORT, TOKEN, TURNS, WORDS, INTERVAL_MS = (
    int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
    float(sys.argv[6]))
first_sent = []


class Provider(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def chunk(data):
            body = f"data: {data}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(body), body))
            self.wfile.flush()

        for i in range(WORDS):
            if i:
                time.sleep(INTERVAL_MS / 1000)
            chunk(json.dumps({"choices": [{"index": 0, "delta": {"content": f"word{i} "}}]}))
            if i == 0:
                first_sent.append(time.monotonic())
        chunk(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
        chunk("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


server = Server(("127.0.0.1", PROVIDER_PORT), Provider)
threading.Thread(target=server.serve_forever, daemon=True).start()
body = json.dumps({"message": "what vendors do I have?", "pageContext": {"pageType": "vendor_table"}})


def turn(stream):
    conn = http.client.HTTPConnection("127.0.0.1", GATEWAY_PORT, timeout=60)
    headers = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json",
               "accept": "text/event-stream" if stream else "application/json"}
    start = time.monotonic()
    conn.request("POST", "/v1/chat", body, headers)
    resp = conn.getresponse()
    assert resp.status == 200, resp.status
    first = None
    seen = b""
    while True:
        piece = resp.read1(65536)
        if not piece:
            break
        seen += piece
        if first is None and b"event: answer_delta" in seen:
            first = time.monotonic()
    end = time.monotonic()
    conn.close()
    if stream:
        assert b"event: done" in seen, seen[-300:]
    return start, first, end


for i in range(TURNS):
    for stream in (True, False):
        first_sent.clear()
        start, first, end = turn(stream)
        row = {"mode": "streamed" if stream else "whole", "whole_ms": (end - start) * 1000}
        if stream:
            row["ttfb_ms"] = (first - start) * 1000
            row["after_provider_ms"] = (first - first_sent[0]) * 1000
        print(json.dumps(row), flush=True)
