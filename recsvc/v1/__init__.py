"""Generated gRPC stubs for recsvc.v1 (see proto/ and scripts/gen_proto.sh)."""
