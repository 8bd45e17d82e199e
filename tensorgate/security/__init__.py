"""Access control run in the protocols' first step, before any body is read or decoded."""
