"""Stub packages copied into real-parser venvs (never imported from here)."""
