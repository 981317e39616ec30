"""Model families. Each package's model.py is importable without torch."""
