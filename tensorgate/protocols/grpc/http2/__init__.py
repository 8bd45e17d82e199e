"""HTTP/2 (RFC 9113) for the gRPC listener, on the event loop: frames, and one connection's state."""
