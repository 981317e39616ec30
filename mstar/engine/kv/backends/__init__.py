"""Paged attention backends: torch (reference, any device), FlashInfer paged prefill and decode,
FA3 varlen over pages gathered per layer."""
