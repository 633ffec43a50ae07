"""Talking to an OpenAI-compatible server: the API client (client.py) and the streaming wire
the benchmarks use (wire.py), both on one HTTP core (transport.py)."""
