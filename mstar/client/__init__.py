"""Python SDK over HTTP (httpx)."""

from mstar.client.client import Client, MstarError

__all__ = ["Client", "MstarError"]
