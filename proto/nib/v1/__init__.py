"""Generated protobuf and gRPC stubs for the nib.v1 wire contract (see completion.proto)."""
