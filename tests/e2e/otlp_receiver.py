"""A minimal OTLP/HTTP trace receiver for the e2e cluster: it accepts what an OpenTelemetry exporter posts
to ``/v1/traces`` (protobuf, optionally gzip), keeps the spans in memory and serves them back as JSON on
``GET /spans?traceId=<32 hex>``, so a test can see which spans reached it and how they are parented.

It runs in the project's image (its virtualenv has ``opentelemetry-proto``, the exporter's own dependency),
mounted from a ConfigMap: ``python otlp_receiver.py PORT``. Standard library otherwise; no collector binary
to build."""

from __future__ import annotations

import gzip
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

MAX_SPANS = 100_000  # a bound on the memory it keeps: the oldest spans go first
MAX_BODY_BYTES = 16 * 1024 * 1024


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(value, kind)
    return str(getattr(value, kind))


def _attributes(attributes: Any) -> dict[str, Any]:
    pairs: list[KeyValue] = list(attributes)
    return {pair.key: _value(pair.value) for pair in pairs}


def flatten(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    """One JSON-able record per span, with its resource's ``service.name``."""
    spans = []
    for resource_spans in request.resource_spans:
        service = _attributes(resource_spans.resource.attributes).get("service.name")
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    {
                        "service": service,
                        "name": span.name,
                        "traceId": span.trace_id.hex(),
                        "spanId": span.span_id.hex(),
                        "parentSpanId": span.parent_span_id.hex(),
                        "startTimeUnixNano": span.start_time_unix_nano,
                        "endTimeUnixNano": span.end_time_unix_nano,
                        "attributes": _attributes(span.attributes),
                    }
                )
    return spans


class Store:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[dict[str, Any]] = []

    def add(self, spans: list[dict[str, Any]]) -> None:
        with self._lock:
            self._spans.extend(spans)
            del self._spans[:-MAX_SPANS]

    def of_trace(self, trace_id: str | None) -> list[dict[str, Any]]:
        with self._lock:
            return [span for span in self._spans if trace_id is None or span["traceId"] == trace_id]


STORE = Store()


class Handler(BaseHTTPRequestHandler):
    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        if urlsplit(self.path).path != "/v1/traces":
            self._answer(404, b"not found\n", "text/plain")
            return
        length = int(self.headers.get("content-length") or 0)
        if length > MAX_BODY_BYTES:
            self._answer(413, b"too large\n", "text/plain")
            return
        body = self.rfile.read(length)
        if (self.headers.get("content-encoding") or "").lower() == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except Exception:  # a body that is not an export request: the exporter's fault, said so
            self._answer(400, b"not an ExportTraceServiceRequest\n", "text/plain")
            return
        STORE.add(flatten(request))
        self._answer(200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/healthz":
            self._answer(200, b"ok\n", "text/plain")
        elif url.path == "/spans":
            trace_id = parse_qs(url.query).get("traceId", [None])[0]
            self._answer(200, json.dumps(STORE.of_trace(trace_id)).encode(), "application/json")
        else:
            self._answer(404, b"not found\n", "text/plain")

    def log_message(self, format: str, *args: Any) -> None:
        return None  # one line per export would be noise


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 4318
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)  # all of the pod's addresses
    server.serve_forever()


if __name__ == "__main__":
    main()
