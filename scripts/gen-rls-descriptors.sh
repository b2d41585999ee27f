#!/usr/bin/env bash
# Regenerates crates/tollgate-server/proto/rls_descriptor_set.bin: the encoded protobuf
# FileDescriptorSet of envoy.service.ratelimit.v3 (rls.proto and everything it imports) that the
# gRPC server reflection serves, so `grpcurl localhost:8081 list` needs no proto files. Run it
# after changing the envoy-types version; needs `protoc` and the well-known types
# (Debian: apt-get install protobuf-compiler libprotobuf-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(cargo metadata --format-version 1 --locked |
  python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"]=="envoy-types"))')
proto=$(dirname "$(cargo metadata --format-version 1 --locked |
  python3 -c 'import json,sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"]=="envoy-types"))')")/proto
echo "envoy-types $version: $proto"
protoc --include_imports \
  --descriptor_set_out=crates/tollgate-server/proto/rls_descriptor_set.bin \
  -I /usr/include -I "$proto/data-plane-api" -I "$proto/xds" -I "$proto/protoc-gen-validate" \
  -I "$proto/googleapis" \
  envoy/service/ratelimit/v3/rls.proto
echo "wrote crates/tollgate-server/proto/rls_descriptor_set.bin"
