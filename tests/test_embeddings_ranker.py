"""The embeddings backend: tool vectors from an OpenAI-compatible /v1/embeddings, kept in the store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
from conftest import KEY, ServerThread, keel_config, tenant, tool

from proxy.config import ServerConfig
from proxy.stores.sqlite import SqliteStore
from proxy.tools.catalog import build_catalog
from proxy.tools.embeddings import EmbeddingsRanker
from proxy.upstream_aiohttp import AiohttpUpstream

TOOLS = [tool(f"tool_{i}", f"Does thing number {i} with files and folders") for i in range(12)]


async def test_vectors_embedded_once_and_kept_in_the_store(standin: ServerThread, tmp_path: Path) -> None:
    """A new catalog ranks lexically while it is embedded; another process reuses the stored vectors."""
    store = SqliteStore(str(tmp_path / "v.db"))
    upstream = AiohttpUpstream(ServerConfig())
    catalog = build_catalog("c", TOOLS)
    state = standin.app.state.standin
    ranker = EmbeddingsRanker(upstream, store, standin.url + "/v1", "emb-1", None)
    first = await ranker.rank("thing number 3", catalog, range(12), 5)
    assert catalog.entries[first.order[0]].name == "tool_3"  # lexical, meanwhile
    for _ in range(100):
        if ranker.ready(catalog):
            break
        await asyncio.sleep(0.02)
    assert ranker.ready(catalog) and state.embedding_inputs == 12
    fused = await ranker.rank("thing number 3", catalog, range(12), 5)
    assert len(fused.order) == 12 and state.embedding_inputs == 13  # one query embedding per turn
    again = EmbeddingsRanker(upstream, store, standin.url + "/v1", "emb-1", None)  # a second process
    await again.index(catalog)
    assert state.embedding_inputs == 13  # nothing re-embedded
    other_model = EmbeddingsRanker(upstream, store, standin.url + "/v1", "emb-2", None)
    await other_model.index(catalog)
    assert state.embedding_inputs == 25  # vectors are per model
    await upstream.aclose()
    await store.close()


def test_embeddings_backend_through_http(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    cfg = tenant(standin.url + "/v1", tools={"enabled": True, "defer": {"min_tools": 5, "schema_chars": 0},
                                             "select": {"backend": "embeddings", "model": "emb", "timeout_ms": 1500}})
    keel = start_keel(keel_config(cfg))
    body = {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "thing number 7 please"}]}
    for _ in range(3):
        r = httpx.post(keel.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"})
        assert r.status_code == 200
    assert standin.app.state.standin.embedding_inputs >= 12
    assert r.headers["x-keel-tools"].endswith("/12")
