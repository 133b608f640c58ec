"""The model catalog and how pinned model files are fetched (PyPI wheels, hashes)."""
