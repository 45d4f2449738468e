"""Keel's own caches of answers: a repeated request answered for nothing (`cache.responses`,
`cache.embeddings`, both off by default).

    answers.py     ResponseCache: where the cache sits in a request's path (before planning, and
                   why), lookup, hit, lead and follow a flight, keep what is whole
    key.py         the key: the request as the client meant it, and who asked
    policy.py      what is looked up, what is kept, the client's Cache-Control and TTL headers
    entries.py     entries in the store: bounded by bytes and TTL per tenant, purged by generation
    flights.py     coalescing: identical requests in flight share one upstream call
    replay.py      an answer in the form a client wants (JSON, or its shape's stream)
    chat.py responses.py messages.py   each shape's answers: whole, read from a stream, written as one
    embeddings.py  /v1/embeddings per input item
    counts.py      hits, bytes and dollars saved: /metrics and the savings ledger
    admin.py       DELETE /v1/keel/cache (a tenant's admin key), as `keel purge-cache`
"""
