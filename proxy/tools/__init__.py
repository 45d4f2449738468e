"""Lean tools: defer schemas, rank the catalog against the turn, answer tool_search in Keel."""
