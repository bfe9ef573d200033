"""Benchmarks behind ``experiments/bench.py``; results go to ``BENCHMARKS.md``."""
