"""Stubs generated from ``../protos`` by ``tensorgate.protocols.grpc.generate``: do not edit."""
