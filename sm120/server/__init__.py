"""The one HTTP door to an OpenAI-compatible server (client.py) and the wire format
the benchmarks stream with (wire.py)."""
