"""Foundations every layer may use: errors, suggestions, size bounds, .env files, addresses
and ports, pid locks, and where sm120 keeps its state. Nothing here imports the rest of sm120."""
