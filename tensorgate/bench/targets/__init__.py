"""One module per protocol the load generator speaks; ``factory.build_target`` picks one."""
