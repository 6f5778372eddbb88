"""Fixtures for the ray area (filled in by its issue)."""
