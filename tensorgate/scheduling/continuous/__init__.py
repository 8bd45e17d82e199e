"""Continuous (iteration-level) batching for generative models: a pure step scheduler and its driver."""
