"""Naming failures in whole logs (catalogue signatures, start-up phases, silence) and scoring
that naming against labelled real logs."""
