"""Fixtures for the db area (filled in by its issue)."""
