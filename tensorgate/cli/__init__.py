"""Entry points: serve, bench."""
