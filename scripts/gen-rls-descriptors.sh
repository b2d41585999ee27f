#!/usr/bin/env bash
# Regenerates crates/tollgate-server/proto/rls_descriptor_set.bin: the encoded protobuf
# FileDescriptorSet of envoy.service.ratelimit.v3 (rls.proto and everything it imports) that the
# gRPC server reflection serves, so `grpcurl localhost:8081 list` needs no proto files.
#
# Usage: scripts/gen-rls-descriptors.sh PROTO_DIR
# PROTO_DIR holds Envoy's API protos and their imports as sibling directories: data-plane-api,
# xds, protoc-gen-validate and googleapis (the `proto/` directory of the envoy-types crate's
# source is laid out so). Needs `protoc` and the well-known types (Debian: apt-get install
# protobuf-compiler libprotobuf-dev). Run it when crates/tollgate-proto changes, so reflection
# describes what the service speaks.
set -euo pipefail
[ $# -eq 1 ] && [ -d "$1/data-plane-api" ] || {
  echo "usage: $0 PROTO_DIR (a directory with data-plane-api, xds, protoc-gen-validate, googleapis)" >&2
  exit 2
}
proto=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
protoc --include_imports \
  --descriptor_set_out=crates/tollgate-server/proto/rls_descriptor_set.bin \
  -I /usr/include -I "$proto/data-plane-api" -I "$proto/xds" -I "$proto/protoc-gen-validate" \
  -I "$proto/googleapis" \
  envoy/service/ratelimit/v3/rls.proto
echo "wrote crates/tollgate-server/proto/rls_descriptor_set.bin"
