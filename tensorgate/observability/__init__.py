"""Metrics, structured logging and tracing."""
