"""Serving benchmark client, per-step profiler, diffusers baseline runner."""
