"""HTTP: KServe V2 (JSON and Triton's binary extension), V1 predict, health and metadata."""
