"""Benchmarks: nanobert against PyTorch / transformers, run from the repository root."""
