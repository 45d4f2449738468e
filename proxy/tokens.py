"""Token counting with tiktoken (o200k_base), cached per distinct text, with an offline fallback.

tiktoken downloads its encodings on first use; where it cannot (no network and no
`TIKTOKEN_CACHE_DIR`), `TokenCounter` falls back to an estimate of ~4 characters per token
so that nothing on the request path ever fails for want of a tokenizer.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tiktoken

log = logging.getLogger("keel.tokens")


class TokenCounter:
    def __init__(self, encoding: str = "o200k_base", cache_chars: int = 4_000_000) -> None:
        self.encoding_name = encoding
        self._encoding: tiktoken.Encoding | None = None
        self._loaded = False
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._cache_chars = cache_chars  # bounded by the texts' size, not their number
        self._cached_chars = 0

    @property
    def exact(self) -> bool:
        """True when real BPE counts are available, False when counts are estimates."""
        return self._load() is not None

    def _load(self) -> tiktoken.Encoding | None:
        if not self._loaded:
            self._loaded = True
            try:
                import tiktoken

                self._encoding = tiktoken.get_encoding(self.encoding_name)
            except Exception as exc:  # network refused, cache missing, package absent
                log.warning("tokenizer_unavailable", extra={"encoding": self.encoding_name, "error": str(exc)})
                self._encoding = None
        return self._encoding

    def encode(self, text: str) -> tuple[int, ...]:
        """Token ids of `text` (or pseudo-ids from 4-character chunks when estimating)."""
        cached = self._cache.get(text)
        if cached is not None:
            self._cache.move_to_end(text)
            return cached
        encoding = self._load()
        if encoding is not None:
            ids = tuple(encoding.encode(text, disallowed_special=()))
        else:
            ids = tuple(hash(text[i : i + 4]) & 0xFFFFFF for i in range(0, len(text), 4))
        if len(text) <= self._cache_chars // 8:
            self._cache[text] = ids
            self._cached_chars += len(text)
            while self._cached_chars > self._cache_chars:
                dropped, _ = self._cache.popitem(last=False)
                self._cached_chars -= len(dropped)
        return ids

    def count(self, text: str) -> int:
        """How many tokens (not cached: callers keep counts of what they count often)."""
        encoding = self._load()
        if encoding is None:
            return (len(text) + 3) // 4
        return len(encoding.encode(text, disallowed_special=()))
