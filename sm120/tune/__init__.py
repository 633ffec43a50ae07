"""`sm120 tune NAME`: the fastest configuration of a recipe on this host, for this work."""
