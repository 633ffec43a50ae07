"""Measuring a running deployment: throughput benchmarks, correctness gates, evaluations."""
