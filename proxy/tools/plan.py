"""What the tool planner decided for one turn, handed to the responder that answers tool_search
(a module of its own so the response side reads it without importing the planner)."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.tools.catalog import Catalog


@dataclass(frozen=True)
class ToolPlan:
    catalog: Catalog
    surfaced: tuple[str, ...]
    deferred: tuple[str, ...]
    offered: int
    outcome: str  # ranked | ranking_fallback (lexical, the backend failed) | no_tool_needed | not_ranked | segment
    dispatch: bool = False  # later tools are called through call_tool; the block never changes
    shown: frozenset[str] = frozenset()  # outside the block, tools whose schema the model has seen this segment
