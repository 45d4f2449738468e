"""The embeddings cache: /v1/embeddings answered per input item (`cache.embeddings: on`).

Embeddings are deterministic: the same text under the same model, `dimensions` and
`encoding_format` always has the same vector, so each input item is kept on its own (keyed by
those, the query string and who asked, as in `proxy.respcache.key`). A batch whose items are
partly cached sends only the missing ones upstream (each once, however often the batch
repeats it), and the answer lists every vector in the client's order, each at its index, with
the usage the upstream reported for what was actually sent (zero when nothing was). A batch
with nothing cached goes upstream byte for byte and its reply comes back as it came; only a
reply that had to be merged is Keel's own JSON (vectors as the upstream wrote them).

`Cache-Control: no-store` passes the request by, `no-cache` looks nothing up and keeps the fresh
vectors. Identical batches in flight are not coalesced (each is one upstream call, of its
missing items only). Reply header: `x-keel-response-cache: hit; cached=5/5`, `miss; cached=3/5`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import orjson
from starlette.responses import Response

from proxy import client_ids, jsontext
from proxy.encoding import ReplyEncodingError, coding, decode_all, is_encoded
from proxy.errors import ProxyError
from proxy.ingress import Caller
from proxy.jsontext import Json
from proxy.relay import Writer, client_headers, read_limited
from proxy.respcache.answers import HEADER, ResponseCache, label
from proxy.respcache.entries import Entries, Entry
from proxy.respcache.key import Asker, embedding_key
from proxy.respcache.policy import directives, ttl_of
from proxy.tokens import TokenCounter
from proxy.upstream import UpstreamResponse
from proxy.usage import Usage

EMBEDDINGS = "embeddings"
READ_LIMIT = 64 * 1024 * 1024  # a reply larger than this is relayed unread (whole batches) or refused (merged ones)


class MergeError(ProxyError):
    status = 502
    type = "upstream_error"
    code = "embeddings_unmergeable"


def items_of(body: Json) -> list[Json] | None:
    """The input items of an embeddings request (text, or a token array), or None for a body Keel does not read."""
    value = body.get("input") if isinstance(body, dict) else None
    if isinstance(value, str) or (isinstance(value, list) and value and all(type(v) is int for v in value)):
        return [value]
    if isinstance(value, list) and value and all(
            isinstance(v, str) or (isinstance(v, list) and v and all(type(t) is int for t in v)) for v in value):
        return list(value)
    return None


class EmbeddingsCache:
    def __init__(self, entries: Entries, answers: ResponseCache, tokens: TokenCounter) -> None:
        self.entries, self.answers, self.tokens = entries, answers, tokens
        self.counts = answers.counts
        self._pending: dict[tuple[str, str], Entry] = {}  # (tenant, key) -> an entry on its way to the store

    @staticmethod
    def applies(caller: Caller, method: str, path: str) -> bool:
        return caller.tenant.cache.embeddings == "on" and method == "POST" and path == EMBEDDINGS

    async def serve(self, caller: Caller, raw: bytes, headers: Mapping[str, str],
                    send: Callable[[bytes | None], Awaitable[UpstreamResponse]], writer: Writer,
                    query: str = "") -> Response:
        tenant = caller.tenant
        try:
            body = jsontext.loads(raw)
        except ValueError:
            body = None
        items = items_of(body)
        said = directives(headers)
        if items is None or "no-store" in said or not isinstance(body, dict):
            self.counts.outcome(tenant.id, EMBEDDINGS, "bypass")
            return await self._relay(await send(raw), writer, label("bypass", "no-store" if items else "unreadable"))
        user = caller.bound_user or client_ids.end_user(headers, body)
        asker = Asker.of(tenant.id, caller.scope, user, None, tenant.cache.stored.scope == "tenant")
        keys = [embedding_key(asker, body.get("model"), body.get("dimensions"), body.get("encoding_format"), query, i)
                for i in items]
        unique = list(dict.fromkeys(keys))
        cached: dict[str, Entry] = {}
        refresh = "no-cache" in said or said.get("max-age", 1) == 0
        if not refresh:
            try:
                found = await self.entries.get_many(tenant.id, unique)
            except Exception:  # the store's failures: everything is a miss, never an error
                found = [None] * len(unique)
            max_age = said.get("max-age")
            found = [e or self._pending.get((tenant.id, k)) for k, e in zip(unique, found, strict=True)]
            cached = {k: e for k, e in zip(unique, found, strict=True)
                      if e is not None and (max_age is None or time.time() - e.created <= max_age)}
        missing = [k for k in unique if k not in cached]
        hits = sum(1 for k in keys if k in cached)
        state = "refresh" if refresh else ("hit" if not missing else "miss")
        tag = f"{state}; cached={hits}/{len(keys)}"
        self.counts.outcome(tenant.id, EMBEDDINGS, "hit", hits)
        self.counts.outcome(tenant.id, EMBEDDINGS, "refresh" if refresh else "miss", len(keys) - hits)
        model = str(body.get("model") or "")
        usage: Json = {"prompt_tokens": 0, "total_tokens": 0}
        vectors = {k: e.body for k, e in cached.items()}
        if missing:
            first = {k: items[keys.index(k)] for k in missing}
            whole = len(missing) == len(keys)
            sent = raw if whole else jsontext.dumps({**body, "input": [first[k] for k in missing]})
            response = await send(sent)
            prefix, rest = await read_limited(response, READ_LIMIT)
            if rest is not None or response.status != 200:
                if not whole and rest is not None:
                    await response.aclose()
                    raise MergeError("the upstream's embeddings reply is too large to merge with cached items")
                return self._reply(response, prefix, rest, writer, tag)
            reply = self._read(response, prefix, len(missing))
            if reply is None:
                if whole:
                    return self._reply(response, prefix, None, writer, tag)
                raise MergeError("the upstream's embeddings reply does not have one vector per input item")
            fresh, model, usage = reply
            ttl = ttl_of(headers, tenant.cache)
            for k, vector in zip(missing, fresh, strict=True):
                vectors[k] = vector
                if ttl > 0:
                    entry = Entry(time.time(), vector, model, tokens=self._tokens(first[k]))
                    self._pending[(tenant.id, k)] = entry
                    self.answers.spawn(self._keep(tenant.id, k, entry, ttl, caller))
            if whole:  # nothing was cached: the upstream's reply as it came
                return self._reply(response, prefix, None, writer, tag)
        data = [{"object": "embedding", "index": n, "embedding": orjson.Fragment(vectors[k])}
                for n, k in enumerate(keys)]
        if not missing:
            model = next(iter(cached.values())).model or model
        out = orjson.dumps({"object": "list", "data": data, "model": model, "usage": usage})
        if hits:
            saved = sum(cached[k].tokens for k in keys if k in cached)
            self.counts.saved(tenant, EMBEDDINGS, model, Usage(input=saved), len(out), hits)
        rid = writer.request_id
        return writer.whole(out, 200, {"x-request-id": rid, "x-keel-request-id": rid, HEADER: tag}, "application/json")

    def _read(self, response: UpstreamResponse, body: bytes, count: int) -> tuple[list[bytes], str, Json] | None:
        """The reply's vectors by index (as the upstream wrote them), its model and usage; None
        for a reply that is not one vector per item sent."""
        try:
            plain = decode_all(body, coding(response)) if is_encoded(response) else body
            reply = jsontext.loads(plain)
        except (ValueError, ReplyEncodingError):
            return None
        data = reply.get("data") if isinstance(reply, dict) else None
        if not isinstance(data, list) or len(data) != count:
            return None
        vectors: list[bytes | None] = [None] * count
        for item in data:
            index = item.get("index") if isinstance(item, dict) else None
            if type(index) is not int or not 0 <= index < count or "embedding" not in item:
                return None
            vectors[index] = jsontext.dumps(item["embedding"])
        if any(v is None for v in vectors):
            return None
        return [v for v in vectors if v is not None], str(reply.get("model") or ""), reply.get("usage")

    def _tokens(self, item: Json) -> int:
        return self.tokens.count(item) if isinstance(item, str) else len(item)

    async def _keep(self, tenant: str, digest: str, entry: Entry, ttl: float, caller: Caller) -> None:
        try:
            written, evicted = await self.entries.put(tenant, digest, entry, ttl, caller.tenant.cache.stored)
            self.counts.stored(tenant, written, evicted)
        except Exception:  # bookkeeping: a store that fails costs the next hit, never this answer
            return
        finally:
            self._pending.pop((tenant, digest), None)

    @staticmethod
    def _reply(response: UpstreamResponse, prefix: bytes, rest: AsyncIterator[bytes] | None, writer: Writer,
               tag: str) -> Response:
        headers = client_headers(response, writer.request_id)
        headers[HEADER] = tag
        if rest is not None:
            return writer.rest(response, prefix, rest, headers)
        return writer.whole(prefix, response.status, headers)

    async def _relay(self, response: UpstreamResponse, writer: Writer, tag: str) -> Response:
        prefix, rest = await read_limited(response, READ_LIMIT)
        return self._reply(response, prefix, rest, writer, tag)
