"""One ranker per backend configuration, built once per process and shared by tenants."""

from __future__ import annotations

import logging

from proxy.config import ToolsConfig
from proxy.tools.ranking import LexicalRanker, Ranker

log = logging.getLogger("keel.tools")


class Rankers:
    def __init__(self) -> None:
        self.lexical = LexicalRanker()
        self._local: dict[str, Ranker] = {}

    def for_config(self, config: ToolsConfig) -> Ranker:
        select = config.select
        if select.backend == "local" and select.model_dir:
            ranker = self._local.get(select.model_dir)
            if ranker is None:
                ranker = self._load_local(select.model_dir)
                self._local[select.model_dir] = ranker
            return ranker
        return self.lexical

    def _load_local(self, model_dir: str) -> Ranker:
        try:
            from proxy.tools.local import LocalEncoder, LocalRanker

            return LocalRanker(LocalEncoder(model_dir))
        except Exception as exc:  # extra not installed, model missing: rank lexically, loudly
            log.error("local_ranker_unavailable", extra={"model_dir": model_dir, "error": repr(exc)})
            return self.lexical
