"""The `llm` ranker: any OpenAI-compatible chat model chooses among numbered candidates.

One request per batch of at most `max_catalog_tools` candidates (a larger catalog is first
ordered by the lexical ranker, and only its best `2 x max_catalog_tools` are shown), all
batches at once. Each request asks the needs-tool question (P(yes) from the first token's
logprobs, or the answer's first word) and for the numbers of the best tools. An answer that
is neither is unparseable: the planner counts the judgment as failed and surfaces only the
always-surfaced tools.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

from proxy.jsontext import Json
from proxy.judge import ask
from proxy.tools.catalog import Catalog
from proxy.tools.ranking import LexicalRanker, Ranking
from proxy.upstream import Upstream

BATCHES = 2


class LlmRanker:
    def __init__(self, upstream: Upstream, base_url: str, model: str, api_key: str | None, max_options: int,
                 question: str) -> None:
        self.upstream = upstream
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.max_options, self.question = model, max_options, question
        self.api_key = api_key
        self.lexical = LexicalRanker()

    def batches(self, query: str, catalog: Catalog, candidates: Sequence[int]) -> list[list[int]]:
        """Candidates in lexical order (unscored ones after), cut to the shown maximum, in batches."""
        ranked = list(self.lexical.rank_now(query, catalog, candidates, 1).order)
        rest = [i for i in candidates if i not in set(ranked)]
        shown = (ranked + rest)[: self.max_options * BATCHES]
        return [shown[i : i + self.max_options] for i in range(0, len(shown), self.max_options)]

    async def _ask(self, query: str, catalog: Catalog, batch: list[int], shortlist: int) -> tuple[float, list[int], Json]:
        options = "\n".join(f"{n}. {catalog.entries[i].name}: {catalog.entries[i].description[:200]}"
                            for n, i in enumerate(batch, 1))
        prompt = (f"<tools>\n{options}\n</tools>\n<user_message>\n{query}\n</user_message>\n"
                  f"First line: yes or no. {self.question}\n"
                  f"Second line: the numbers of the tools that fit best, best first, at most {shortlist}, or none.")
        judgment = await ask(self.upstream, self.url, self.api_key, self.model,
                             "You are a classifier that picks tools.", prompt)
        lines = judgment.lines
        numbers = [int(n) for n in re.findall(r"\d+", lines[1])] if len(lines) > 1 else []
        picks = [batch[n - 1] for n in numbers if 1 <= n <= len(batch)]
        return judgment.p_yes, picks, judgment.usage

    async def rank(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking:
        batches = self.batches(query, catalog, candidates)
        if not batches:
            return Ranking((), (), 0.0, None)
        answers = await asyncio.gather(*(self._ask(query, catalog, b, shortlist) for b in batches))
        needs = max(a[0] for a in answers)
        order: list[int] = []
        for depth in range(max(len(a[1]) for a in answers)):  # interleave the batches' picks, best first
            for _, picks, _ in sorted(answers, key=lambda a: -a[0]):
                if depth < len(picks) and picks[depth] not in order:
                    order.append(picks[depth])
        usage: dict[str, int] = {}
        for *_, u in answers:
            for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
                usage[k] = usage.get(k, 0) + int((u or {}).get(k, 0) or 0)
        scores = tuple(float(len(order) - i) for i in range(len(order)))
        return Ranking(tuple(order), scores, needs, needs if order else None, usage)
