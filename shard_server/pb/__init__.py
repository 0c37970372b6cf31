"""Generated protobuf/gRPC stubs of proto/generate.proto (regenerate with `python -m shard_server.pb.regen`)."""
