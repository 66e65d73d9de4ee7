"""Shared test helpers (small random checkpoints); fixtures built on them live in tests/conftest.py."""
