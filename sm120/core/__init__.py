"""Foundations every layer may use: errors, suggestions, size bounds, .env files, addresses
and ports, pid locks, dataclasses read back from JSON, and where sm120 keeps its state.
Nothing here imports the rest of sm120."""
