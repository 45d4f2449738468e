"""Yes/no judgments by a chat model: one request, P(yes) from the first answer token.

Shared by the model-backed memory gate and tool ranker. P(yes) is the yes share of the yes/no
probability mass in the first token's `top_logprobs`; without logprobs, the answer's first
word decides; anything else raises `JudgeError` (an unparseable judgment is a failed one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import orjson

from proxy.encoding import decoded
from proxy.jsontext import Json, JsonObject
from proxy.upstream import Upstream, json_headers


class JudgeError(ValueError):
    """The judge's upstream failed, or it answered neither yes nor no."""


@dataclass(frozen=True)
class Judgment:
    p_yes: float
    lines: list[str]  # the answer's lines (the first is the yes/no)
    usage: Json


def p_yes(choice: JsonObject) -> float:
    content = (choice.get("message") or {}).get("content") or ""
    tokens = (choice.get("logprobs") or {}).get("content") or []
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
    raise JudgeError(f"the judge answered {content[:40]!r}")


async def ask(upstream: Upstream, url: str, api_key: str | None, model: str, system: str, prompt: str,
              max_tokens: int = 24) -> Judgment:
    body = {"model": model, "temperature": 0, "max_tokens": max_tokens, "logprobs": True, "top_logprobs": 5,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}]}
    response = await upstream.open("POST", url, json_headers(api_key), orjson.dumps(body))
    raw = await decoded(response).read()
    if response.status != 200:
        raise JudgeError(f"the judge's upstream answered {response.status}")
    data = orjson.loads(raw)
    choice = data["choices"][0]
    lines = ((choice.get("message") or {}).get("content") or "").strip().splitlines()
    return Judgment(p_yes(choice), lines, data.get("usage"))
