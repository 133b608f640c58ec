"""A tiny OTLP/HTTP traces receiver, run as its own process: what a collector would get.

    python tests/support/otlp_receiver.py OUT.jsonl [HOST PORT]

It binds a free port on 127.0.0.1 (or HOST:PORT: the compose stack's smoke test runs it as a
service the replicas export to, on 0.0.0.0:4318), prints the port on its first line of stdout, and for each
POST to /v1/traces decodes the protobuf `ExportTraceServiceRequest` with opentelemetry-proto
and appends one JSON line per span to OUT.jsonl (ids in hex, attributes as plain values, the
resource's service.name, links, status), then answers 200 with an empty response. The tests read
the file; nothing here knows tierroute.
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

_lock = threading.Lock()


def plain(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [plain(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: plain(kv.value) for kv in value.kvlist_value.values}
    return None if kind is None else getattr(value, kind)


def spans_of(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    out = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: plain(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(
                    {
                        "service": resource.get("service.name"),
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex() or None,
                        "name": span.name,
                        "kind": span.kind,
                        "start_ns": span.start_time_unix_nano,
                        "end_ns": span.end_time_unix_nano,
                        "attributes": {kv.key: plain(kv.value) for kv in span.attributes},
                        "links": [{"trace_id": k.trace_id.hex(), "span_id": k.span_id.hex()} for k in span.links],
                        "status": span.status.code,
                    }
                )
    return out


def main(out_path: str, host: str = "127.0.0.1", port: int = 0) -> None:
    out = Path(out_path)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            lines = "".join(json.dumps(s) + "\n" for s in spans_of(request))
            with _lock, out.open("a") as f:
                f.write(lines)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
            return None

    server = ThreadingHTTPServer((host, port), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) not in (2, 4):
        sys.exit("usage: otlp_receiver.py OUT.jsonl [HOST PORT]")
    main(sys.argv[1], *((sys.argv[2], int(sys.argv[3])) if len(sys.argv) == 4 else ()))
