"""The savings summary for one tenant and time range: what the page shows and `keel report` prints.

Dollars include the memory model: without the gate it would have run on every judged message,
so a skipped run counts as saved at the memory model's average cost per run (this range's,
else every run recorded, else an estimate of the skipped run's own prompt); the gate's own
model calls count against it. A request answered from Keel's own cache saved what its upstream
call cost (`answers`).
"""

from __future__ import annotations

import re
import time

from proxy.jsontext import JsonObject
from proxy.savings.facts import CAUSES
from proxy.savings.ledger import DAY, HOUR, Ledger, day_of, summed

_SINCE = re.compile(r"^(\d+(?:\.\d+)?)\s*([mhdw])$")
_UNIT = {"m": 60, "h": HOUR, "d": DAY, "w": 7 * DAY}
GATES = ("ranked", "ranking_fallback", "no_tool_needed", "not_ranked", "segment")


def parse_since(text: str, now: float | None = None) -> float:
    """'7d', '24h', '90m', '2w' ago, or a date (YYYY-MM-DD, UTC): the range's start as a timestamp."""
    now = time.time() if now is None else now
    found = _SINCE.match(text.strip().lower())
    if found:
        return now - float(found.group(1)) * _UNIT[found.group(2)]
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%d")) - time.timezone
    except ValueError:
        raise ValueError(f"--since: {text!r} is not like 7d, 24h, 90m or 2025-01-31") from None


def _ratio(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole else None


async def summary(ledger: Ledger, tenant: str, since: float, until: float | None = None,
                  top: int = 10) -> JsonObject:
    until = time.time() if until is None else until
    hours = await ledger.hours(tenant, since, until)
    t = summed(c for _, c in hours)
    runs, skips = t.get("memory_run", 0.0), t.get("memory_skip", 0.0)
    average = t.get("usd_memory", 0.0) / runs if runs else await ledger.memory_average(tenant)
    if average is None and skips:
        average = t.get("usd_memory_skipped_estimate", 0.0) / skips
    avoided = skips * (average or 0.0)
    causes = {c: t.get(f"usd_{c}", 0.0) for c in CAUSES}
    causes["judgments"] -= t.get("usd_memory_gate", 0.0)
    causes["memory"] = avoided
    answers = t.get("usd_answers", 0.0)  # requests answered from Keel's own cache: their upstream cost, all saved
    causes["answers"] = answers
    direct_usd = t.get("usd_direct", 0.0) + t.get("usd_memory", 0.0) + avoided + answers
    keel_usd = t.get("usd_keel", 0.0) + t.get("usd_memory", 0.0) + t.get("usd_memory_gate", 0.0)
    by_day: dict[str, dict[str, float]] = {}
    for start, counters in hours:
        row = by_day.setdefault(day_of(start), {})
        for name in ("turns", "input_direct", "input_keel", "cached_direct", "cached_keel", "usd_direct", "usd_keel"):
            row[name] = row.get(name, 0.0) + counters.get(name, 0.0)
    conversations = await ledger.conversations(tenant, since, until)
    ranked = sorted(conversations.items(), key=lambda kv: -kv[1].get("usd_keel", 0.0))[:top]
    calls = t.get("calls", 0.0)
    return {
        "tenant": tenant, "since": since, "until": until, "turns": int(t.get("turns", 0)),
        "input_tokens": {
            "direct": int(t.get("input_direct", 0)), "keel": int(t.get("input_keel", 0)),
            "saved": int(t.get("input_direct", 0) - t.get("input_keel", 0)),
            "by_cause": {"tools": int(t.get("tokens_tools", 0)), "search": -int(t.get("tokens_search", 0))},
        },
        "cached_tokens": {"direct": int(t.get("cached_direct", 0)), "keel": int(t.get("cached_keel", 0)),
                          "cache_write": int(t.get("cache_write", 0))},
        "cached_fraction": {"direct": _ratio(t.get("cached_direct", 0), t.get("input_direct", 0)),
                            "keel": _ratio(t.get("cached_keel", 0), t.get("input_keel", 0))},
        "output_tokens": int(t.get("output", 0)),
        "dollars": {"direct": round(direct_usd, 6), "keel": round(keel_usd, 6),
                    "saved": round(direct_usd - keel_usd, 6),
                    "saved_fraction": _ratio(direct_usd - keel_usd, direct_usd),
                    "by_cause": {k: round(v, 6) for k, v in causes.items()}},
        "tool_search": {"rounds": int(t.get("rounds", 0)), "turns_with_rounds": int(t.get("turns_searched", 0))},
        "first_shot_recall": {"calls": int(calls), "first_shot": int(t.get("calls_first_shot", 0)),
                              "recall": _ratio(t.get("calls_first_shot", 0), calls)},
        "tool_gate": {g: int(t.get(f"gate_{g}", 0)) for g in GATES},
        "memory_gate": {"run": int(runs), "skip": int(skips), "failed": int(t.get("memory_failed", 0)),
                        "average_run_usd": round(average, 8) if average is not None else None,
                        "avoided_usd": round(avoided, 6)},
        "misses": {"planned": int(t.get("misses_planned", 0)), "unexplained": int(t.get("misses_unexplained", 0))},
        "response_cache": {"hits": int(t.get("responses_hits", 0)), "embedding_items": int(t.get("embeddings_hits", 0)),
                           "tokens": int(t.get("tokens_answers", 0)), "saved_usd": round(answers, 6)},
        "days": [{"day": f"{d[:4]}-{d[4:6]}-{d[6:]}", **{k: round(v, 6) for k, v in row.items()}}
                 for d, row in sorted(by_day.items())],
        "top_conversations": [
            {"conversation": c, "turns": int(v.get("turns", 0)), "input_keel": int(v.get("input_keel", 0)),
             "usd_keel": round(v.get("usd_keel", 0.0), 6), "usd_direct": round(v.get("usd_direct", 0.0), 6),
             "saved": round(v.get("usd_direct", 0.0) - v.get("usd_keel", 0.0), 6)} for c, v in ranked],
    }


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def render_text(report: JsonObject) -> str:
    """The summary as a terminal table."""
    tokens, dollars, cached = report["input_tokens"], report["dollars"], report["cached_fraction"]
    start = time.strftime("%Y-%m-%d %H:%M", time.gmtime(report["since"]))
    lines = [f"Keel savings for tenant {report['tenant']} since {start} UTC: {report['turns']} turns", ""]
    lines.append(f"{'':28}{'direct':>14}{'through Keel':>16}{'saved':>14}")
    lines.append(f"{'input tokens':28}{tokens['direct']:>14,}{tokens['keel']:>16,}{tokens['saved']:>14,}")
    lines.append(f"{'cached fraction':28}{_pct(cached['direct']):>14}{_pct(cached['keel']):>16}")
    lines.append(f"{'dollars (input + output)':28}{dollars['direct']:>14.4f}{dollars['keel']:>16.4f}"
                 f"{dollars['saved']:>14.4f}  ({_pct(dollars['saved_fraction'])})")
    lines += ["", "saved by cause:"]
    labels = {"tools": "tools deferred", "search": "tool_search rounds", "cache": "cache reads gained",
              "judgments": "judgments (Keel's own model calls)", "memory": "memory-model runs avoided",
              "answers": "answered from Keel's cache"}
    token_causes = tokens["by_cause"]
    for cause, usd in dollars["by_cause"].items():
        extra = f"  {token_causes[cause]:+,} input tokens" if cause in token_causes else ""
        lines.append(f"  {labels[cause]:36}{usd:>+12.4f} ${extra}")
    recall, search, gate, memory = (report["first_shot_recall"], report["tool_search"], report["tool_gate"],
                                    report["memory_gate"])
    lines += ["", f"tool_search rounds: {search['rounds']} (in {search['turns_with_rounds']} turns)",
              f"first-shot recall: {_pct(recall['recall'])} ({recall['first_shot']}/{recall['calls']} tool calls "
              "shipped with the first call)",
              "tool gate: " + ", ".join(f"{k} {v}" for k, v in gate.items() if v),
              f"memory gate: run {memory['run']}, skip {memory['skip']}, failed {memory['failed']}"]
    answered = report["response_cache"]
    if answered["hits"] or answered["embedding_items"]:
        lines.append(f"response cache: {answered['hits']} answers, {answered['embedding_items']} embedding items "
                     f"served ({answered['tokens']:,} tokens, ${answered['saved_usd']:.4f} not spent upstream)")
    if report["top_conversations"]:
        lines += ["", "top conversations by cost:"]
        for c in report["top_conversations"]:
            lines.append(f"  {c['conversation'][:40]:42}{c['turns']:>5} turns  ${c['usd_keel']:.4f}"
                         f"  (direct ${c['usd_direct']:.4f})")
    return "\n".join(lines)
