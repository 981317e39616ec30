"""Ragged attention over packed segments: backends, plan cache, shared workspace."""
