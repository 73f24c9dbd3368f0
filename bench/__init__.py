"""Benchmarks (never run as tests): ``python -m bench.durable_puts``."""
