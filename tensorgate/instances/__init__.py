"""Instances of a model: in a thread or an isolated worker process, and the pool that picks one."""
