"""Benchmarks: `v4serve bench kernels` (kernels.py) times every op at the PR's shapes."""
