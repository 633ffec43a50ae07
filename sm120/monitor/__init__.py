"""Monitoring: log parsing, metrics, peaks and the watchdog."""
