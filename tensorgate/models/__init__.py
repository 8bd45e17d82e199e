"""ModelManager (load, warm up, ready, drain, unload), ModelRouter and the InferenceService."""
