"""Benchmarks of the gpumon exporter against the naive design; ``python -m bench`` writes
bench/RESULTS.md. Not part of the installed package and not a test suite."""
