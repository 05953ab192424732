"""Benchmarks: `python -m bench.run [--only NAME] [--quick]` -> docs/benchmarks.md (see bench/run.py)."""
