"""Multi-node processes: one engine over several hosts, each node reached over ssh or
through its Docker engine over ssh://, and the small agent sm120 runs on each node."""
