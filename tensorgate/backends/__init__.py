"""Model runtimes behind one Backend protocol: onnxruntime, python classes, causal LMs."""
