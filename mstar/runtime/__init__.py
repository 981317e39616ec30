"""Conductor, worker processes, typed messages and transport. Never imports torch at module level."""
