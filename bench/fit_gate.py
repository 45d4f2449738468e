"""Fit the embedded needs-tool gate's weights (proxy/tools/gate.py: WEIGHTS, SEMANTIC_WEIGHTS).

    python bench/fit_gate.py

Logistic regression (numpy, L2) over `gate.features` on the fit half of MetaTool's awareness set
(bench/splits.py; the eval half is never fitted on) and Keel's labelled agent queries (weighted
3x: they are the tool catalogs Keel serves); then over `gate.semantic_features`, which add the
local model's cosines in units of its own scale (needs the `local` extra and
../shared/data/models). POSITIVE_WEIGHT weighs turns that need a tool against the others (1: the
gate's own floors already keep requests to act on the safe side; 2 was measured and cost
leanness on the fit rows without a gain in recall). For each it first fits on one half of the fit rows and
prints accuracy on the other half, then fits on all the fit rows and prints the weights to
paste into gate.py.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import splits
from common import CATALOGS, SHARED

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from proxy.tools.catalog import Catalog, build_catalog
from proxy.tools.gate import features, semantic_features
from proxy.tools.ranking import LexicalRanker

METATOOL = SHARED / "data" / "eval" / "metatool"
MODEL_DIR = SHARED / "data" / "models" / "all-MiniLM-L6-v2-int8"
Featurize = Callable[[list[str], Catalog], np.ndarray]


def lexical(queries: list[str], catalog: Catalog) -> np.ndarray:
    ranker = LexicalRanker()
    return np.array([features(q, ranker.rank_now(q, catalog, range(len(catalog.entries)), 5).top_score)
                     for q in queries])


def semantic(queries: list[str], catalog: Catalog) -> np.ndarray:
    from proxy.tools.local import GateExamples, LocalEncoder, tool_text

    encoder = LocalEncoder(MODEL)
    examples = GateExamples(encoder)
    matrix = encoder.encode([tool_text(e) for e in catalog.entries])
    ranker = LexicalRanker()
    out = []
    for q in queries:  # one query at a time, as Keel encodes them
        vector = encoder.encode([q])[0]
        evidence = examples.evidence(vector, matrix @ vector)
        top = ranker.rank_now(q, catalog, range(len(catalog.entries)), 5).top_score
        out.append(semantic_features(q, top, evidence))
    return np.array(out)


def rows(featurize: Featurize) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    descriptions = json.loads((METATOOL / "plugin_des.json").read_text())
    mt = build_catalog("metatool", [{"type": "function", "function": {"name": n, "description": d}}
                                    for n, d in descriptions.items()])
    agent = build_catalog("agent", orjson.loads((CATALOGS / "agent_8servers.json").read_bytes())["tools"])
    awareness = [{"query": q, "label": "positive" if y else "negative"} for q, y in splits.metatool_awareness("fit")]
    queries = [json.loads(line) for line in (Path(__file__).parent / "data" / "agent_queries.jsonl").read_text()
               .splitlines()]
    x_mt = featurize([r["query"] for r in awareness], mt)
    y_mt = np.array([r["label"] == "positive" for r in awareness], float)
    x_ag = featurize([r["query"] for r in queries], agent)
    y_ag = np.array([r["tool"] is not None for r in queries], float)
    return x_mt, y_mt, x_ag, y_ag


POSITIVE_WEIGHT = 1.0


def fit(x: np.ndarray, y: np.ndarray, l2: float = 0.01, steps: int = 3000, rate: float = 0.5) -> np.ndarray:
    w = np.zeros(x.shape[1])
    weight = np.where(y > 0.5, POSITIVE_WEIGHT, 1.0)
    for _ in range(steps):
        p = 1 / (1 + np.exp(-x @ w))
        w -= rate * (x.T @ (weight * (p - y)) / weight.sum() + l2 * np.r_[0, w[1:]])
    return w


def accuracy(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    return float((((x @ w) > 0) == (y > 0.5)).mean())


def report(name: str, featurize: Featurize) -> None:
    x_mt, y_mt, x_ag, y_ag = rows(featurize)
    mt_idx, ag_idx = list(range(len(y_mt))), list(range(len(y_ag)))
    random.Random(0).shuffle(mt_idx)
    random.Random(0).shuffle(ag_idx)
    mt_a, mt_b = mt_idx[: len(mt_idx) // 2], mt_idx[len(mt_idx) // 2 :]
    ag_a, ag_b = ag_idx[: len(ag_idx) // 2], ag_idx[len(ag_idx) // 2 :]
    w = fit(np.concatenate([x_mt[mt_a], *[x_ag[ag_a]] * 3]), np.concatenate([y_mt[mt_a], *[y_ag[ag_a]] * 3]))
    print(f"{name}: accuracy on the other half of the fit rows (coverage): MetaTool awareness {accuracy(x_mt[mt_b], y_mt[mt_b], w):.3f} "
          f"({len(mt_b)} rows), agent queries {accuracy(x_ag[ag_b], y_ag[ag_b], w):.3f} ({len(ag_b)} rows)")
    w = fit(np.concatenate([x_mt, *[x_ag] * 3]), np.concatenate([y_mt, *[y_ag] * 3]))
    print(f"{name}: fitted on all fit rows: MetaTool {accuracy(x_mt, y_mt, w):.3f}, agent {accuracy(x_ag, y_ag, w):.3f}")
    print(f"{name}: (" + ", ".join(f"{v:.3f}" for v in w) + ")")


MODEL = MODEL_DIR


def main() -> None:
    report("WEIGHTS", lexical)
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        print("(onnxruntime not installed: SEMANTIC_WEIGHTS not fitted)")
        return
    report("SEMANTIC_WEIGHTS", semantic)


if __name__ == "__main__":
    main()
