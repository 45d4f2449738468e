"""The `embeddings` ranker: any OpenAI-compatible /v1/embeddings endpoint, fused with BM25.

Tool vectors are kept in the store by model and schema hash, so replicas and restarts embed a
tool once; a catalog is embedded in the background on first sight and ranked lexically until
then. Each turn costs one embeddings request for the query (under the ranking deadline).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import orjson

from proxy.encoding import decoded
from proxy.jsontext import Json
from proxy.stores import KeyValue, key
from proxy.tools.catalog import Catalog
from proxy.tools.local import fuse, tool_text
from proxy.tools.ranking import LexicalRanker, Ranking
from proxy.upstream import Upstream, json_headers

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    Vectors = NDArray[np.float32]  # unit-length embeddings, one row per text

BATCH = 128
VECTOR_TTL = 90 * 24 * 3600


MAX_MATRICES = 32  # catalogs whose vectors are kept in memory (they are in the store too)


class EmbeddingsRanker:
    def __init__(self, upstream: Upstream, store: KeyValue, base_url: str, model: str, api_key: str | None) -> None:
        self.upstream, self.store = upstream, store
        self.url = base_url.rstrip("/") + "/embeddings"
        self.model = model
        self.headers = json_headers(api_key)
        self.lexical = LexicalRanker()
        self._matrices: OrderedDict[str, Vectors] = OrderedDict()  # catalog key -> vectors, the newest kept
        self._indexing: dict[str, asyncio.Task[None]] = {}

    async def embed(self, texts: Sequence[str]) -> Vectors:
        import numpy as np

        body = orjson.dumps({"model": self.model, "input": list(texts)})
        response = await self.upstream.open("POST", self.url, self.headers, body)
        raw = await decoded(response).read()
        if response.status != 200:
            raise RuntimeError(f"embeddings endpoint answered {response.status}")
        data = sorted(orjson.loads(raw)["data"], key=lambda d: d["index"])
        vectors = np.array([d["embedding"] for d in data], dtype=np.float32)
        return cast("Vectors", vectors / np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9, None))

    def _key(self, text: str) -> str:
        return key(f"embeddings:{self.model}", hashlib.sha256(text.encode()).hexdigest())

    async def index(self, catalog: Catalog) -> None:
        """Load the catalog's tool vectors from the store, embedding (and storing) only the missing."""
        import numpy as np

        texts = [tool_text(e) for e in catalog.entries]
        stored = await self.store.get_many([self._key(t) for t in texts])
        vectors: list[Json] = [np.frombuffer(raw, dtype=np.float32) if raw else None for raw in stored]
        missing = [i for i, v in enumerate(vectors) if v is None]
        for start in range(0, len(missing), BATCH):
            batch = missing[start : start + BATCH]
            for i, vector in zip(batch, await self.embed([texts[i] for i in batch]), strict=True):
                vectors[i] = vector
                await self.store.set(self._key(texts[i]), vector.astype(np.float32).tobytes(), VECTOR_TTL)
        self._matrices[catalog.key] = np.stack(vectors)
        while len(self._matrices) > MAX_MATRICES:
            self._matrices.popitem(last=False)

    def ready(self, catalog: Catalog) -> bool:
        if catalog.key in self._matrices:
            self._matrices.move_to_end(catalog.key)
            return True
        if catalog.key not in self._indexing and len(self._indexing) < MAX_MATRICES:
            task = asyncio.get_running_loop().create_task(self.index(catalog))
            self._indexing[catalog.key] = task  # forgotten when done: a failed one is tried again later
            key_ = catalog.key

            def forget(done: asyncio.Task[None]) -> None:
                self._indexing.pop(key_, None)

            task.add_done_callback(forget)
        return False

    async def rank(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking:
        if not self.ready(catalog):
            return self.lexical.rank_now(query, catalog, candidates, shortlist)
        vector = (await self.embed([query]))[0]
        return fuse(self._matrices[catalog.key], vector, query, catalog, candidates, shortlist)
