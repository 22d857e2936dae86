"""Uploads in parts: what does not fit one request body arrives in parts (design §3.2)."""
