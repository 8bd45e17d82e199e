"""The only place that knows HTTP or gRPC: V2 (JSON and binary), V1, OpenAI, gRPC."""
