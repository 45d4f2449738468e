"""The `local` ranker: a small sentence-embedding model in-process, fused with BM25.

Any ONNX sentence-embedding model with a tokenizer.json (all-MiniLM-L6-v2 as int8 ONNX by
default; onnxruntime + tokenizers, the optional `local` extra): a model that outputs a sentence
embedding is used as it is, else its token states are pooled as its 1_Pooling/config.json says
(mean by default, CLS when it says so). The needs-tool gate reads the model's cosines on the
model's own scale, measured at load on the gate's example turns, so no model's scale is assumed. Tool
vectors are computed once per schema, off the request path: until a catalog's vectors are
ready its turns are ranked lexically, so a new catalog never stalls a request. Scores fuse
0.2 * BM25/max with 0.8 * min-max-scaled cosine.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from proxy.tools.catalog import Catalog, ToolEntry
from proxy.tools.gate import NEEDS_TOOL_EXAMPLES, NO_TOOL_EXAMPLES, SemanticEvidence, needs_tool_probability
from proxy.tools.ranking import NAMED_BOOST, LexicalRanker, Ranking, confidence, lexical_scores, namespaces
from proxy.tools.text import english_hint

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    Vectors = NDArray[np.float32]  # unit-length embeddings, one row per text

log = logging.getLogger("keel.tools")

BM25_WEIGHT = 0.2
COSINE_WEIGHT = 0.8


class LocalEncoder:
    """Text → L2-normalised mean-pooled vectors with an ONNX sentence-embedding model."""

    def __init__(self, model_dir: str | Path, max_tokens: int = 128) -> None:
        import numpy as np
        import onnxruntime
        from tokenizers import Tokenizer

        directory = Path(model_dir)
        self._np = np
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_tokens)
        self.tokenizer.no_padding()  # some exports pad to a fixed length; one text needs none
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(str(directory / "model.onnx"), options,
                                                    providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self.session.get_inputs()}
        outputs = [o.name for o in self.session.get_outputs()]
        self._sentence_output = next((o for o in outputs if "sentence" in o or "pooler" in o), None)
        pooling = directory / "1_Pooling" / "config.json"
        self._cls = pooling.exists() and bool(json.loads(pooling.read_text()).get("pooling_mode_cls_token"))
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> Vectors:
        """One vector per text, each run on its own: with int8 dynamic quantization a batch shares
        its activation ranges (padding included), so a batched vector would depend on its
        batch-mates, and a tool's vector on which tools happened to be indexed with it (DESIGN's
        invariant 6: the same inputs render the same bytes on any replica)."""
        np = self._np
        return cast("Vectors", np.stack([self._encode_one(text) for text in texts]) if texts else np.zeros((0, 0)))

    def _encode_one(self, text: str) -> Vectors:
        np = self._np
        encoding = self.tokenizer.encode(text)
        ids = np.array([encoding.ids], dtype=np.int64)
        mask = np.array([encoding.attention_mask], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        feed = {k: v for k, v in feed.items() if k in self._inputs}
        with self._lock:
            if self._sentence_output is not None:
                pooled = self.session.run([self._sentence_output], feed)[0][0]
                return cast("Vectors", pooled / max(float(np.linalg.norm(pooled)), 1e-9))  # onnxruntime: untyped
            hidden = self.session.run(None, feed)[0][0]
        pooled = hidden[0] if self._cls else (hidden * mask[0][:, None]).sum(axis=0) / max(int(mask.sum()), 1)
        return cast("Vectors", pooled / max(float(np.linalg.norm(pooled)), 1e-9))


def tool_text(entry: ToolEntry) -> str:
    return f"{entry.name.replace('_', ' ')}: {entry.description}"


class LocalRanker:
    def __init__(self, encoder: LocalEncoder) -> None:
        self.encoder = encoder
        self.examples = GateExamples(encoder)
        log.info("local model cosine scale (example turns): mean %.3f, spread %.3f", *self.examples.scale)
        self.lexical = LexicalRanker()
        self._vectors: OrderedDict[str, Vectors] = OrderedDict()  # schema hash → vector (bounded, newest kept)
        self._matrices: OrderedDict[str, Vectors] = OrderedDict()  # catalog key → matrix (rows in catalog order)
        self._pending: set[str] = set()
        self._lock = threading.Lock()

    @staticmethod
    def _schema_hash(entry: ToolEntry) -> str:
        return hashlib.blake2b(tool_text(entry).encode(), digest_size=16).hexdigest()

    def index(self, catalog: Catalog) -> None:
        """Embed every tool of a catalog not seen before (blocking; run it off the request path)."""
        np = self.encoder._np
        missing = [e for e in catalog.entries if self._schema_hash(e) not in self._vectors]
        for entry in missing:
            self._vectors[self._schema_hash(entry)] = self.encoder.encode([tool_text(entry)])[0]
        matrix = np.stack([self._vectors[self._schema_hash(e)] for e in catalog.entries])
        with self._lock:
            self._matrices[catalog.key] = matrix
            self._pending.discard(catalog.key)
            while len(self._matrices) > 32:
                self._matrices.popitem(last=False)
            while len(self._vectors) > 20_000:
                self._vectors.popitem(last=False)

    def ready(self, catalog: Catalog) -> bool:
        if catalog.key in self._matrices:
            return True
        with self._lock:
            if catalog.key not in self._pending:
                self._pending.add(catalog.key)
                threading.Thread(target=self.index, args=(catalog,), daemon=True).start()
        return False

    async def rank(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking:
        if not self.ready(catalog):
            return self.lexical.rank_now(query, catalog, candidates, shortlist)
        vector = (await asyncio.to_thread(self.encoder.encode, [english_hint(query)]))[0]
        return self.rank_with(vector, query, catalog, candidates, shortlist)

    def rank_now(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking:
        """Synchronous ranking (benchmarks): indexes the catalog first if needed."""
        self.matrix(catalog)
        return self.rank_with(self.encoder.encode([english_hint(query)])[0], query, catalog, candidates, shortlist)

    def matrix(self, catalog: Catalog) -> Vectors:
        """The catalog's tool vectors, rows in catalog order (indexed now, blocking, if needed)."""
        if catalog.key not in self._matrices:
            self.index(catalog)
        return self._matrices[catalog.key]

    def rank_with(self, vector: Vectors, query: str, catalog: Catalog, candidates: Sequence[int],
                  shortlist: int) -> Ranking:
        return fuse(self._matrices[catalog.key], vector, query, catalog, candidates, shortlist, self.examples)


class GateExamples:
    """The gate's example turns as vectors (gate.NEEDS_TOOL_EXAMPLES / NO_TOOL_EXAMPLES), and the
    model's cosine scale measured on them: the mean and spread of their pairwise cosines. The
    gate's evidence is in those units (a z-score), so SEMANTIC_WEIGHTS hold for any model."""

    def __init__(self, encoder: LocalEncoder) -> None:
        import numpy as np

        self.needs = encoder.encode(NEEDS_TOOL_EXAMPLES)
        self.none = encoder.encode(NO_TOOL_EXAMPLES)
        both = np.concatenate([self.needs, self.none])
        pairs = (both @ both.T)[np.triu_indices(len(both), 1)]
        self.scale = (float(pairs.mean()), max(float(pairs.std()), 1e-6))  # this model's cosine scale

    def margin(self, vector: Vectors) -> float:
        """Mean cosine to the three closest needs-tool examples minus that to the three closest others."""
        import numpy as np

        return float(np.sort(self.needs @ vector)[-3:].mean() - np.sort(self.none @ vector)[-3:].mean())

    def evidence(self, vector: Vectors, cosines: Vectors) -> SemanticEvidence:
        """The gate's evidence for a turn, on this model's scale: its best five cosines to the
        tools and its margin, each in spreads of the example turns' cosines (from their mean)."""
        import numpy as np

        mean, spread = self.scale
        best = (np.sort(cosines)[::-1][:5] - mean) / spread
        return SemanticEvidence(best.tolist(), self.margin(vector) / spread)


def fuse(matrix: Vectors, vector: Vectors, query: str, catalog: Catalog, candidates: Sequence[int],
         shortlist: int, examples: GateExamples | None = None) -> Ranking:
    """0.2 x BM25/max + 0.8 x min-max-scaled cosine over the candidates (rows of `matrix`).
    `examples`: the needs-tool gate also weighs the local model's evidence, on its own scale."""
    import numpy as np

    if not candidates:
        return Ranking((), (), needs_tool_probability(0.0, query), None)
    idx = np.asarray(candidates)
    cosine = matrix[idx] @ vector
    low, high = float(cosine.min()), float(cosine.max())
    scaled = (cosine - low) / (high - low) if high > low else np.zeros_like(cosine)
    bm25 = lexical_scores(query, catalog)
    lexical = np.array([bm25.get(int(i), 0.0) for i in idx])
    top_bm25 = float(lexical.max()) if len(lexical) else 0.0
    fused = COSINE_WEIGHT * scaled + (BM25_WEIGHT * lexical / top_bm25 if top_bm25 > 0 else 0.0)
    named = namespaces(catalog).named(query)
    if named:
        fused = fused * np.array([NAMED_BOOST if int(i) in named else 1.0 for i in idx])
    order = np.argsort(-fused, kind="stable")
    scores = tuple(float(fused[i]) for i in order)
    gate = examples.evidence(vector, cosine) if examples else None
    return Ranking(tuple(int(idx[i]) for i in order), scores, needs_tool_probability(top_bm25, query, gate),
                   confidence(scores, shortlist))
