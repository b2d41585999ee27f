"""An OTLP trace receiver for crates/tollgate/tests/tracing.rs, on the OpenTelemetry project's
own protobuf messages (PyPI `opentelemetry-proto`) and gRPC (`grpcio`): the collector's
`TraceService/Export` over gRPC and `POST /v1/traces` (http/protobuf), both on loopback ports
of the system's choosing.

It prints `listening grpc=PORT http=PORT` once both are up, then one JSON line per span
received (`via`, `name`, ids in hex, `kind`, `attributes`, `resource`, `status`), and exits
when its standard input closes (the test holds it open)."""

import json
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

LOCK = threading.Lock()


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind is None:
        return None
    return getattr(v, kind)


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def record(via, request):
    lines = []
    for rs in request.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for span in ss.spans:
                lines.append(
                    json.dumps(
                        {
                            "via": via,
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "kind": span.kind,
                            "attributes": attributes(span.attributes),
                            "resource": resource,
                            "status": span.status.code,
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                        }
                    )
                )
    with LOCK:
        for line in lines:
            print(line)
        sys.stdout.flush()


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        record("grpc", request)
        return trace_service_pb2.ExportTraceServiceResponse()


class Http(BaseHTTPRequestHandler):
    def do_POST(self):
        if self.path != "/v1/traces":
            self.send_response(404)
            self.end_headers()
            return
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        record("http", request)
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    http = ThreadingHTTPServer(("127.0.0.1", 0), Http)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    with LOCK:
        print(f"listening grpc={grpc_port} http={http.server_address[1]}")
        sys.stdout.flush()
    sys.stdin.read()
    server.stop(0)
    http.shutdown()


if __name__ == "__main__":
    main()
