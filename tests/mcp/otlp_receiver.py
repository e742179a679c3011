"""An OTLP/HTTP trace receiver for the telemetry tests: `POST /v1/traces` (protobuf), decoded with
the OpenTelemetry project's own message definitions (PyPI `opentelemetry-proto`).

    otlp_receiver.py PORT OUTDIR

Writes OUTDIR/spans.jsonl (one JSON object per span: ids in hex, attributes, resource), every
request body as received to OUTDIR/raw.bin and every request's headers to OUTDIR/headers.jsonl,
so the tests can check both what arrived and that nothing secret did.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

port, out = int(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
lock = threading.Lock()
MAX_BODY = 16 * 1024 * 1024


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        if self.path != "/v1/traces" or not 0 < length <= MAX_BODY:
            self.send_error(404 if self.path != "/v1/traces" else 400)
            return
        body = self.rfile.read(length)
        request = ExportTraceServiceRequest.FromString(body)
        lines = []
        for rs in request.resource_spans:
            resource = {a.key: value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    lines.append(json.dumps({
                        "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(), "trace_state": s.trace_state,
                        "name": s.name, "kind": s.kind, "status": s.status.code,
                        "status_message": s.status.message,
                        "attributes": {a.key: value(a.value) for a in s.attributes},
                        "events": [{"name": e.name, "attributes": {a.key: value(a.value) for a in e.attributes}}
                                   for e in s.events],
                        "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                        "resource": resource, "scope": ss.scope.name,
                    }))
        with lock:
            with open(out / "raw.bin", "ab") as f:
                f.write(body)
            with open(out / "headers.jsonl", "a") as f:
                f.write(json.dumps(dict(self.headers.items())) + "\n")
            with open(out / "spans.jsonl", "a") as f:
                f.writelines(line + "\n" for line in lines)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
