"""Independent PyTorch / transformers references that produce the fixtures in tests/fixtures."""
