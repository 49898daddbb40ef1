"""Benchmark scripts (offline acceptance, serving sweeps, kernels); run as modules."""
