"""The local backend: a real int8 ONNX sentence-embedding model (../shared/data/models), fused with BM25."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from conftest import CATALOGS, KEY, MODEL_DIR, ServerThread, keel_config, needs_catalogs, needs_model, tenant, tuned

from proxy.tools.catalog import build_catalog

pytest.importorskip("onnxruntime", reason="the optional 'local' extra is part of the dev install")
from proxy.tools.local import LocalEncoder, LocalRanker

pytestmark = [needs_model, needs_catalogs]


@pytest.fixture(scope="module")
def encoder() -> LocalEncoder:
    return LocalEncoder(MODEL_DIR)


def tools() -> list[dict[str, Any]]:
    all_tools: list[dict[str, Any]] = orjson.loads((CATALOGS / "agent_8servers.json").read_bytes())["tools"]
    wanted = {"maps_directions", "maps_geocode", "slack_post_message", "read_file", "write_file", "create_branch",
              "get_current_time", "fetch", "list_issues", "search_code", "merge_pull_request", "convert_time"}
    return [t for t in all_tools if t["function"]["name"] in wanted]


def test_vectors_are_normalised(encoder: LocalEncoder) -> None:
    vectors = encoder.encode(["hello world", "a much longer sentence about tools and ranking"])
    norms = (vectors**2).sum(axis=1)
    assert vectors.shape == (2, 384) and abs(norms[0] - 1) < 1e-4 and abs(norms[1] - 1) < 1e-4


def test_a_vector_does_not_depend_on_its_batch(encoder: LocalEncoder) -> None:
    """int8 dynamic quantization shares activation ranges across a batch: each text runs alone."""
    short, long = "read a file", "search the code of every repository for a function that parses dates " * 3
    assert (encoder.encode([short, long])[0] == encoder.encode([short])[0]).all()
    assert (encoder.encode([long, short])[1] == encoder.encode([short])[0]).all()


def test_paraphrase_found_where_no_word_is_shared(encoder: LocalEncoder) -> None:
    """A query sharing no word with the tool's name or description still ranks it first."""
    catalog = build_catalog("t", tools())
    ranker = LocalRanker(encoder)
    ranking = ranker.rank_now("How do I drive from Munich to Salzburg?", catalog, range(len(catalog.entries)), 5)
    assert catalog.entries[ranking.order[0]].name == "maps_directions"
    ranking = ranker.rank_now("tell the team in chat that we shipped", catalog, range(len(catalog.entries)), 5)
    assert catalog.entries[ranking.order[0]].name == "slack_post_message"


async def test_unindexed_catalog_ranks_lexically_meanwhile(encoder: LocalEncoder) -> None:
    """The first sight of a catalog never waits for its vectors: it is ranked by BM25 meanwhile."""
    catalog = build_catalog("fresh", tools())
    ranker = LocalRanker(encoder)
    started = time.perf_counter()
    first = await ranker.rank("read the file notes.txt", catalog, range(len(catalog.entries)), 5)
    assert time.perf_counter() - started < 0.1
    assert catalog.entries[first.order[0]].name == "read_file"
    for _ in range(200):
        if ranker.ready(catalog):
            break
        time.sleep(0.05)
    assert ranker.ready(catalog)


def test_local_backend_through_http(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """With backend local, a paraphrase surfaces the right tool once the catalog is indexed."""
    cfg = {"enabled": True, "stability": "per_turn", "defer": {"min_tools": 5}, "select": {"backend": "local", "model_dir": str(MODEL_DIR),
                                                                   "timeout_ms": 1500}}
    keel = start_keel(keel_config(tenant(standin.url + "/v1", tools=cfg)), planners=tuned(needs_tool_threshold=0.0))
    body = {"model": "m", "tools": tools(), "messages": [{"role": "user", "content": "How do I drive to Salzburg?"}]}
    headers = {"authorization": f"Bearer {KEY}"}
    deadline = time.monotonic() + 30
    while True:
        httpx.post(keel.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
        sent = standin.app.state.standin.requests[-1]
        names = [t["function"]["name"] for t in sent["tools"]]
        if "maps_directions" in names or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert "maps_directions" in names and names[-1] == "tool_search"


def test_gate_weighs_the_cosines(encoder: LocalEncoder) -> None:
    """With the local model the needs-tool gate also weighs how close the turn is to some tool in
    meaning: no word is shared either way, yet a catalog holding a chat tool makes a chat request
    likelier to need a tool than one without it."""
    from proxy.tools.ranking import LexicalRanker

    query = "tell the team in chat that we shipped"
    with_chat = build_catalog("with", tools())
    without = build_catalog("without", [t for t in tools() if not t["function"]["name"].startswith("slack")])
    ranker, lexical = LocalRanker(encoder), LexicalRanker()
    near = ranker.rank_now(query, with_chat, range(len(with_chat.entries)), 5).needs_tool
    far = ranker.rank_now(query, without, range(len(without.entries)), 5).needs_tool
    assert lexical.rank_now(query, with_chat, range(len(with_chat.entries)), 5).needs_tool == \
        lexical.rank_now(query, without, range(len(without.entries)), 5).needs_tool
    assert near > 2 * far


def test_gate_examples_tell_requests_from_tasks(encoder: LocalEncoder) -> None:
    """Closer to the built-in needs-tool examples than to the no-tool ones: a live lookup; the
    reverse: a writing task. Neither sentence is one of the examples."""
    from proxy.tools.gate import NEEDS_TOOL_EXAMPLES, NO_TOOL_EXAMPLES
    from proxy.tools.local import GateExamples

    examples = GateExamples(encoder)
    live, task = "What's the exchange rate of the yen today?", "Write a sonnet about autumn leaves"
    assert live not in NEEDS_TOOL_EXAMPLES and task not in NO_TOOL_EXAMPLES
    assert examples.margin(encoder.encode([live])[0]) > 0 > examples.margin(encoder.encode([task])[0])


class Shifted:
    """The shared model with every vector pulled toward one direction: all cosines rise, as with
    another model whose scale the semantic gate was not fitted on."""

    def __init__(self, encoder: LocalEncoder) -> None:
        self.inner, self._np = encoder, encoder._np
        self.direction = encoder.encode(["a fixed direction"])[0]

    def encode(self, texts: Any) -> Any:
        vectors = self.inner.encode(texts) + 0.8 * self.direction
        return vectors / self._np.linalg.norm(vectors, axis=1, keepdims=True)


def test_a_model_on_another_cosine_scale_reads_alike(encoder: LocalEncoder) -> None:
    """A model whose cosines all sit higher (another model, another export) gets the semantic gate
    on its own scale, measured at load: the same turns come out on the same side."""
    query, catalog = "tell the team in chat that we shipped", build_catalog("c", tools())
    everything = range(len(catalog.entries))
    base, shifted = LocalRanker(encoder), LocalRanker(Shifted(encoder))  # type: ignore[arg-type]
    assert shifted.examples.scale[0] > base.examples.scale[0] + 0.1
    for text in (query, "write a sonnet about autumn leaves for my grandmother"):
        ours, theirs = base.rank_now(text, catalog, everything, 5), shifted.rank_now(text, catalog, everything, 5)
        assert (ours.needs_tool >= 0.5) == (theirs.needs_tool >= 0.5)
        assert abs(ours.needs_tool - theirs.needs_tool) < 0.25
