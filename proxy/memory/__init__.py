"""Gated per-user memory: one cheap judgment decides whether the memory model runs after a turn."""
