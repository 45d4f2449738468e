"""What each turn cost through Keel, and what the client's own request would have cost.

    meter.py   per turn: the client's request and Keel's, the upstream's usage (every round),
               the ranker's scores → one `TurnFacts`, written once, off the request path
    facts.py   `TurnFacts` and how its dollars split by cause (tools deferred, tool_search rounds,
               cache reads gained, judgments)
    ledger.py  the store side: hourly counters per tenant, per-day counters per conversation, a
               capped turn list per conversation (all with retention), memory-gate figures
    report.py  the summary the page and `keel report` show, from the ledger
    page.py    /keel/: the page, its login, the conversation inspector
"""
