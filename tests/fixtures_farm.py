"""Fixtures for the farm area (filled in by its issue)."""
