"""Benchmarks (``python -m benchmarks --help``); results go to ``BENCHMARKS.md``."""
