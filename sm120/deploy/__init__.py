"""Serving for real: launch (one host or many), wait, smoke-test, chat, status and stop."""
