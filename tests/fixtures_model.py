"""Fixtures for the model area (filled in by its issue)."""
