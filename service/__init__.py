"""nib gRPC server."""
