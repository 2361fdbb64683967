"""Benchmarks: our code and the reference side by side in one process. Run one with `python -m benchmarks.NAME`."""
