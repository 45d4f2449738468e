"""The `llm` memory gate: one yes/no question to any OpenAI-compatible chat model.

P(yes) comes from the first answer token's `top_logprobs` (yes vs no mass), falling back to
the answer's first word when the upstream sends no logprobs; anything else is unparseable,
which the worker treats as a gate failure (the memory model runs). The same request asks for
the `valid_keys` category and whether this updates an existing entry: no extra round trip.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import orjson

from proxy.config import TenantConfig
from proxy.memory.gate import GateResult
from proxy.messages import message_text
from proxy.upstream import Upstream


class GateAnswerError(ValueError):
    """The judge answered something that is neither yes nor no."""


def p_yes(choice: dict[str, Any]) -> float:
    content = (choice.get("message") or {}).get("content") or ""
    tokens = ((choice.get("logprobs") or {}).get("content") or [])
    if tokens:
        yes = no = 0.0
        for candidate in tokens[0].get("top_logprobs") or [tokens[0]]:
            word = str(candidate.get("token", "")).strip().lower()
            if word.startswith("yes"):
                yes += math.exp(candidate["logprob"])
            elif word.startswith("no"):
                no += math.exp(candidate["logprob"])
        if yes + no > 0:
            return yes / (yes + no)
    first = content.strip().split(maxsplit=1)[0].strip(".,!").lower() if content.strip() else ""
    if first in ("yes", "no"):
        return 1.0 if first == "yes" else 0.0
    raise GateAnswerError(f"the gate answered {content[:40]!r}")


class LlmMemoryGate:
    def __init__(self, upstream: Upstream, tenant: TenantConfig) -> None:
        self.upstream = upstream
        self.tenant = tenant
        self.usage: Any = None  # the last judgment's usage, for accounting

    async def judge(self, text: str, context: Sequence[dict[str, Any]], valid_keys: Sequence[str],
                    memory: dict[str, str]) -> GateResult:
        cfg = self.tenant.memory
        earlier = "\n".join(f"{m.get('role')}: {message_text(m)}" for m in context)
        lines = [f"<earlier_messages>\n{earlier}\n</earlier_messages>" if earlier else "",
                 f"<newest_message>\n{text}\n</newest_message>", f"Question: {cfg.gate.question}",
                 "Answer yes or no on the first line."]
        if valid_keys:
            lines.append(f"Second line: the category among {', '.join(valid_keys)}, or none.")
            lines.append("Third line: update if it changes one of these existing entries "
                         f"({', '.join(sorted(memory)) or 'none'}), else new.")
        body = {"model": cfg.model, "temperature": 0, "max_tokens": 16, "logprobs": True, "top_logprobs": 5,
                "messages": [{"role": "system", "content": "You are a classifier. Judge only the newest message; "
                              "earlier messages are context."}, {"role": "user", "content": "\n".join(lines)}]}
        base = (cfg.endpoint or self.tenant.upstream.base_url).rstrip("/")
        key = self.tenant.upstream.api_key()
        headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
        response = await self.upstream.open("POST", base + "/chat/completions", headers, orjson.dumps(body))
        raw = await response.read()
        if response.status != 200:
            raise GateAnswerError(f"the gate's upstream answered {response.status}")
        data = orjson.loads(raw)
        choice = data["choices"][0]
        probability = p_yes(choice)
        self.usage = data.get("usage")
        answer = ((choice.get("message") or {}).get("content") or "").strip().splitlines()
        category = answer[1].strip().lower() if valid_keys and len(answer) > 1 else None
        category = next((k for k in valid_keys if k.lower() == category), None)  # unknown or "none": dropped
        updates = len(answer) > 2 and answer[2].strip().lower().startswith("update")
        return GateResult(probability, category, updates)
