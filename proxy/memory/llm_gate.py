"""The `llm` memory gate: one yes/no question to any OpenAI-compatible chat model.

P(yes) comes from `proxy.judge` (logprobs, or the answer's first word); anything else is
unparseable, which the worker treats as a gate failure (the memory model runs). The same request asks for
the `valid_keys` category and whether this updates an existing entry: no extra round trip.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.config import TenantConfig
from proxy.jsontext import Json, JsonObject
from proxy.judge import ask
from proxy.memory.gate import GateResult
from proxy.messages import message_text
from proxy.upstream import Upstream


class LlmMemoryGate:
    def __init__(self, upstream: Upstream, tenant: TenantConfig) -> None:
        self.upstream = upstream
        self.tenant = tenant
        self.usage: Json = None  # the last judgment's usage, for accounting

    async def judge(self, text: str, context: Sequence[JsonObject], valid_keys: Sequence[str],
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
        base, key = self.tenant.model_endpoint(cfg.endpoint, cfg.api_key_env)
        judgment = await ask(self.upstream, base + "/chat/completions", key, cfg.model,
                             "You are a classifier. Judge only the newest message; earlier messages are context.",
                             "\n".join(lines))
        probability, answer, self.usage = judgment.p_yes, judgment.lines, judgment.usage
        category = answer[1].strip().lower() if valid_keys and len(answer) > 1 else None
        category = next((k for k in valid_keys if k.lower() == category), None)  # unknown or "none": dropped
        updates = len(answer) > 2 and answer[2].strip().lower().startswith("update")
        return GateResult(probability, category, updates)
