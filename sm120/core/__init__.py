"""Foundations every layer may use: errors, suggestions, bounds, .env files, addresses,
pid locks. Nothing here imports the rest of sm120."""
