"""Serving for real: launch, wait, smoke-test, and find running deployments again."""
