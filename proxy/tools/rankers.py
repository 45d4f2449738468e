"""One ranker per backend configuration, built once per process and shared by tenants."""

from __future__ import annotations

import logging
import os

from proxy.config import TenantConfig, ToolsConfig
from proxy.stores import Store
from proxy.tools.ranking import LexicalRanker, Ranker
from proxy.upstream import Upstream

log = logging.getLogger("keel.tools")


class Rankers:
    def __init__(self, upstream: Upstream | None = None, store: Store | None = None) -> None:
        self.lexical = LexicalRanker()
        self.upstream, self.store = upstream, store
        self._local: dict[str, Ranker] = {}
        self._embeddings: dict[tuple[str, str], Ranker] = {}

    def for_tenant(self, tenant: TenantConfig) -> Ranker:
        select = tenant.tools.select
        if select.backend == "embeddings" and self.upstream is not None and self.store is not None:
            base = select.endpoint or tenant.upstream.base_url
            model = select.model or "text-embedding-3-small"
            ranker = self._embeddings.get((base, model))
            if ranker is None:
                from proxy.tools.embeddings import EmbeddingsRanker

                api_key = os.environ.get(select.api_key_env) if select.api_key_env else tenant.upstream.api_key()
                ranker = EmbeddingsRanker(self.upstream, self.store, base, model, api_key)
                self._embeddings[(base, model)] = ranker
            return ranker
        if select.backend == "llm" and self.upstream is not None:
            base = select.endpoint or tenant.upstream.base_url
            api_key = os.environ.get(select.api_key_env) if select.api_key_env else tenant.upstream.api_key()
            from proxy.tools.llm import LlmRanker

            return LlmRanker(self.upstream, base, select.model or "gpt-4o-mini", api_key, select.max_catalog_tools,
                             select.question)
        return self.for_config(tenant.tools)

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
