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
        self._remote: dict[tuple[object, ...], Ranker] = {}  # embeddings and llm rankers, by their settings

    def for_tenant(self, tenant: TenantConfig) -> Ranker:
        select = tenant.tools.select
        if select.backend not in ("embeddings", "llm") or self.upstream is None or self.store is None:
            return self.for_config(tenant.tools)
        base = select.endpoint or tenant.upstream.base_url
        model = select.model or ("text-embedding-3-small" if select.backend == "embeddings" else "gpt-4o-mini")
        settings = (select.backend, base, model, select.max_catalog_tools, select.question)
        ranker = self._remote.get(settings)
        if ranker is None:
            api_key = os.environ.get(select.api_key_env) if select.api_key_env else tenant.upstream.api_key()
            if select.backend == "embeddings":
                from proxy.tools.embeddings import EmbeddingsRanker

                ranker = EmbeddingsRanker(self.upstream, self.store, base, model, api_key)
            else:
                from proxy.tools.llm import LlmRanker

                ranker = LlmRanker(self.upstream, base, model, api_key, select.max_catalog_tools, select.question)
            self._remote[settings] = ranker
        return ranker

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
