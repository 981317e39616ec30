"""Python SDK over HTTP (httpx)."""
