"""What LLM-shaped nodes share: continuous batching, sampling, stop rules, tokenizers and chat templates, on the engine's KV pool."""
