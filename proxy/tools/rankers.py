"""One ranker per backend configuration, built once per process and shared by tenants.

The local model is loaded at start; a missing one is fetched in the background while turns
are ranked lexically.
"""

from __future__ import annotations

import logging
import threading

from proxy.config import TenantConfig, ToolsConfig
from proxy.stores import KeyValue
from proxy.tools.model_fetch import default_model_dir, fetch_model, model_present
from proxy.tools.ranking import LexicalRanker, Ranker
from proxy.upstream import Upstream

log = logging.getLogger("keel.tools")


class Rankers:
    def __init__(self, upstream: Upstream | None = None, store: KeyValue | None = None) -> None:
        self.lexical = LexicalRanker()
        self.upstream, self.store = upstream, store
        self._local: dict[str, Ranker] = {}  # by model directory
        self._fetching: set[str] = set()
        self._lock = threading.Lock()
        self._remote: dict[tuple[object, ...], Ranker] = {}  # embeddings and llm rankers, by their settings

    def for_tenant(self, tenant: TenantConfig) -> Ranker:
        select = tenant.tools.select
        if select.backend not in ("embeddings", "llm") or self.upstream is None or self.store is None:
            return self.for_config(tenant.tools)
        base, api_key = tenant.model_endpoint(select.endpoint, select.api_key_env)
        model = select.model or ("text-embedding-3-small" if select.backend == "embeddings" else "gpt-4o-mini")
        settings = (select.backend, base, model, select.max_catalog_tools, select.question)
        ranker = self._remote.get(settings)
        if ranker is None:
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
        if select.backend != "local":
            return self.lexical
        model_dir = select.model_dir or str(default_model_dir())
        ranker = self._local.get(model_dir)
        if ranker is not None:
            return ranker
        if model_present(model_dir):
            self._local[model_dir] = ranker = self._load_local(model_dir)
            return ranker
        with self._lock:
            if model_dir not in self._fetching:  # once per directory
                self._fetching.add(model_dir)
                if select.model_source:
                    threading.Thread(target=self._fetch_and_load, args=(model_dir, select.model_source),
                                     daemon=True).start()
                else:
                    log.error("local_model_missing", extra={"model_dir": model_dir, "hint": "keel fetch-model DIR"})
        return self.lexical  # until the model is there: BM25

    def _fetch_and_load(self, model_dir: str, source: str) -> None:
        """Off the request path: fetch the model once, then swap the local ranker in."""
        try:
            fetch_model(model_dir, source)
        except Exception as exc:  # no network, 404, disk full: stay lexical, loudly
            log.error("local_model_fetch_failed", extra={"model_dir": model_dir, "error": repr(exc)})
            return
        log.info("local_model_fetched", extra={"model_dir": model_dir})
        self._local[model_dir] = self._load_local(model_dir)

    def _load_local(self, model_dir: str) -> Ranker:
        try:
            from proxy.tools.local import LocalEncoder, LocalRanker

            return LocalRanker(LocalEncoder(model_dir))
        except Exception as exc:  # extra not installed, model unreadable: rank lexically, loudly
            log.error("local_ranker_unavailable", extra={"model_dir": model_dir, "error": repr(exc)})
            return self.lexical
