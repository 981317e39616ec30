"""Cosmos3 (NVIDIA Cosmos 3 Nano / Edge): the understanding prefix once, the generation pathway per step."""
