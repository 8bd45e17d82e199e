"""KServe V2 over gRPC (``inference.GRPCInferenceService``), health checking and reflection."""
