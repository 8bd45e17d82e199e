"""Queues (priority, deadlines, admission) and the dynamic batcher."""
