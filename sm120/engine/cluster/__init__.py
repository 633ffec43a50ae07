"""Multi-node processes: one engine over several hosts, each node reached through
ssh or the local Docker engine, and the small agent sm120 runs on each node."""
