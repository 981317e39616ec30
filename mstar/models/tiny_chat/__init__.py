"""tiny-chat: the embedded default text model (a tiny Qwen3 trained here on arithmetic chats)."""
