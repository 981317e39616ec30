"""The embedded default model: a tiny text-to-image DiT trained on handwritten digits."""
