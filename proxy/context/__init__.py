"""Warm prompt caches: freeze the system prompt per segment, deliver change as context updates."""
