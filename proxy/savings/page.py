"""/keel/: the savings page, served by Keel itself (server-rendered HTML and plain SVG, nothing to build).

Who may look: a tenant's admin key (`auth.admin_keys`), as `Authorization: Bearer <key>` or through
the login form, which sets a signed cookie (HttpOnly, SameSite=Strict, path /keel): an expiry 12
hours on, a random nonce, the key's digest, and an HMAC of the three under a secret Keel keeps in
its store (made once, shared by workers and replicas), so neither the config's digest nor an
expired cookie opens anything. Signing out revokes the cookie in the store (every copy of it, on
every worker and replica, until it would have expired); while the store cannot say whether a
cookie was revoked, no cookie opens the page. The cookie opens this page and nothing else, never
the API. An admin sees the tenants it is an admin of.

    GET  /keel/                      summary for ?tenant= and ?since= (24h, 7d, 30d, …)
    GET  /keel/conversation?id=…     the conversation inspector: each turn, what Keel changed and why
    GET  /keel/api/summary, /keel/api/conversation   the same as JSON
    POST /keel/login, /keel/logout
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from html import escape
from urllib.parse import parse_qs, quote, urlsplit

import orjson
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from proxy.config import KeelConfig, TenantConfig
from proxy.jsontext import JsonObject
from proxy.savings.facts import TurnFacts
from proxy.savings.ledger import Ledger
from proxy.savings.report import parse_since, summary
from proxy.stores import KeyValue, StoreError, key

COOKIE = "keel_admin"
COOKIE_SECONDS = 12 * 3600
SECRET_KEY = key("page", "cookie-secret")
RANGES = ("24h", "7d", "30d")
CAUSE_LABELS = {"tools": "tools deferred", "search": "tool_search rounds", "cache": "cache reads gained",
                "judgments": "judgments", "memory": "memory runs avoided", "answers": "answered from Keel's cache"}
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f7f9}
header{background:#14213d;color:#fff;padding:12px 24px;display:flex;gap:24px;align-items:center}
header a{color:#fff}main{padding:16px 24px;max-width:1200px}
h1{font-size:18px;margin:0}h2{font-size:15px;margin:24px 0 8px}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{background:#fff;border-radius:8px;padding:12px 16px;
box-shadow:0 1px 2px #0002;min-width:170px}.card b{display:block;font-size:22px}.card span{color:#57606a}
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px #0002;margin:4px 0}
td,th{padding:5px 10px;border-bottom:1px solid #eaeef2;text-align:right;vertical-align:top}
th{background:#f0f3f6}td.l,th.l{text-align:left}pre{white-space:pre-wrap;margin:0;max-width:420px;font-size:12px}
.pos{color:#1a7f37}.neg{color:#cf222e}svg{background:#fff;border-radius:8px;box-shadow:0 1px 2px #0002}
form.inline{display:inline}small{color:#57606a}
"""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


LOGIN_BODY_LIMIT = 4096  # a sign-in form carries a key, nothing larger


class SavingsPage:
    def __init__(self, config: KeelConfig, ledger: Ledger,
                 read_body: Callable[[Request, int], Awaitable[bytes]], store: KeyValue) -> None:
        self.ledger, self.read_body, self.store = ledger, read_body, store
        self._admins = [(d, t) for t in config.tenants for d in t.auth.key_digests(admin=True)]
        self._secret: bytes | None = None
        self._fallback = secrets.token_bytes(32)  # while the store cannot answer: this process's cookies only

    async def _cookie_secret(self) -> bytes:
        """The cookies' HMAC key: made once in the store, the same for every worker and replica."""
        if self._secret is None:
            try:
                await self.store.set_if_absent(SECRET_KEY, secrets.token_bytes(32), 10 * 365 * 86400)
                self._secret = await self.store.get(SECRET_KEY)
            except StoreError:
                return self._fallback
        return self._secret or self._fallback

    async def _cookie(self, digest: bytes) -> str:
        signed = f"{int(time.time()) + COOKIE_SECONDS}.{secrets.token_hex(8)}.{digest.hex()}"
        return f"{signed}.{hmac.new(await self._cookie_secret(), signed.encode(), 'sha256').hexdigest()}"

    async def _signed(self, cookie: str) -> tuple[int, bytes, str] | None:
        """A cookie's expiry, key digest and MAC, if it is Keel's, unaltered and unexpired."""
        parts = cookie.split(".")
        if len(parts) != 4 or not parts[0].isdigit() or int(parts[0]) < time.time() or len(parts[2]) != 64:
            return None
        signed = ".".join(parts[:3])
        wanted = hmac.new(await self._cookie_secret(), signed.encode(), "sha256").hexdigest()
        if not hmac.compare_digest(wanted, parts[3]):
            return None
        try:
            return int(parts[0]), bytes.fromhex(parts[2]), parts[3]
        except ValueError:
            return None

    async def _from_cookie(self, cookie: str) -> bytes | None:
        """The key digest a cookie was signed for, if it is valid and not signed out."""
        signed = await self._signed(cookie)
        if signed is None:
            return None
        try:
            revoked = await self.store.get(key("page", "revoked", signed[2]))
        except StoreError:
            return None  # cannot tell whether it was signed out: closed
        return None if revoked is not None else signed[1]

    # Who is looking

    def _tenants_for(self, digest: bytes | None) -> list[TenantConfig]:
        if digest is None:
            return []
        return [t for d, t in self._admins if hmac.compare_digest(d, digest)]

    async def _viewer(self, request: Request) -> list[TenantConfig]:
        authorization = request.headers.get("authorization", "")
        if authorization[:7].lower() == "bearer " and authorization[7:].strip():
            return self._tenants_for(_digest(authorization[7:].strip()))
        if request.url.path.startswith("/keel/api/"):
            return []  # the cookie opens the page, never the API
        cookie = request.cookies.get(COOKIE, "")
        return self._tenants_for(await self._from_cookie(cookie)) if cookie else []

    async def _scope(self, request: Request) -> tuple[TenantConfig, str, float] | Response:
        tenants = await self._viewer(request)
        if not tenants:
            if request.url.path.startswith("/keel/api/"):
                return Response(b'{"error":"an admin key is needed"}', status_code=401, media_type="application/json")
            return self._login(status=401 if request.headers.get("authorization") else 200)
        wanted = request.query_params.get("tenant")
        tenant = next((t for t in tenants if t.id == wanted), None) if wanted else tenants[0]
        if tenant is None:
            return Response(f"not an admin of tenant {escape(wanted or '')}".encode(), status_code=403)
        since_text = request.query_params.get("since", "7d")
        try:
            since = parse_since(since_text)
        except ValueError as exc:
            return Response(escape(str(exc)).encode(), status_code=400)
        return tenant, since_text, since

    # Routes

    async def login(self, request: Request) -> Response:
        if _cross_site(request):
            return self._login("Sign in from Keel's own page.", status=403)
        form = parse_qs((await self.read_body(request, LOGIN_BODY_LIMIT)).decode(errors="replace"))
        key = (form.get("key") or [""])[0].strip()
        if not key or not self._tenants_for(_digest(key)):
            return self._login("That is not an admin key of any tenant.", status=401)
        response = RedirectResponse("/keel/", status_code=303)
        response.set_cookie(COOKIE, await self._cookie(_digest(key)), max_age=COOKIE_SECONDS, path="/keel", httponly=True,
                            samesite="strict", secure=request.url.scheme == "https")
        return response

    async def logout(self, request: Request) -> Response:
        """Drop the cookie from the browser and revoke it for every copy (until it would expire)."""
        if _cross_site(request):
            return Response(b"sign out from Keel's own page", status_code=403)
        response = RedirectResponse("/keel/", status_code=303)
        response.delete_cookie(COOKIE, path="/keel")
        signed = await self._signed(request.cookies.get(COOKIE, ""))
        if signed is not None:
            try:
                await self.store.set(key("page", "revoked", signed[2]), b"1", max(1, signed[0] - time.time() + 60))
            except StoreError:
                page = self._login("Signed out of this browser, but Keel's store is unavailable: a copy of the "
                                   "cookie elsewhere stays valid until it expires. Sign out again later.", status=503)
                page.delete_cookie(COOKIE, path="/keel")
                return page
        return response

    async def overview(self, request: Request) -> Response:
        scope = await self._scope(request)
        if isinstance(scope, Response):
            return scope
        tenant, since_text, since = scope
        report = await summary(self.ledger, tenant.id, since)
        others = [t.id for t in (await self._viewer(request))]
        return _html(f"Keel savings: {tenant.id}", _nav(tenant.id, since_text, others) + _overview(report, since_text))

    async def conversation(self, request: Request) -> Response:
        scope = await self._scope(request)
        if isinstance(scope, Response):
            return scope
        tenant, since_text, _ = scope
        conversation = request.query_params.get("id", "")
        turns = await self.ledger.turns(tenant.id, conversation)
        body = _nav(tenant.id, since_text, [t.id for t in (await self._viewer(request))]) + _inspector(conversation, turns)
        return _html(f"Keel: conversation {conversation[:16]}", body)

    async def api_summary(self, request: Request) -> Response:
        scope = await self._scope(request)
        if isinstance(scope, Response):
            return scope
        tenant, _, since = scope
        return Response(orjson.dumps(await summary(self.ledger, tenant.id, since)), media_type="application/json")

    async def api_conversation(self, request: Request) -> Response:
        scope = await self._scope(request)
        if isinstance(scope, Response):
            return scope
        turns = await self.ledger.turns(scope[0].id, request.query_params.get("id", ""))
        data = [{**t.as_dict(), "direct": t.direct.__dict__} for t in turns]
        return Response(orjson.dumps({"turns": data}), media_type="application/json")

    def _login(self, message: str = "", status: int = 200) -> Response:
        note = f'<p class="neg">{escape(message)}</p>' if message else ""
        body = (f"<main><h2>Sign in with a tenant admin key</h2>{note}"
                '<form method="post" action="/keel/login"><input type="password" name="key" size="40" '
                'autofocus placeholder="admin key"> <button>Sign in</button></form>'
                "<p><small>A tenant's <code>auth.admin_keys</code>; the quickstart's is <code>keel-local</code>."
                "</small></p></main>")
        return _html("Keel: sign in", body, status)


def _cross_site(request: Request) -> bool:
    """A form posted from another site (login CSRF): its browser says so in Sec-Fetch-Site or Origin.
    A request with neither (curl, a script) is not a browser's cross-site post."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return True
    origin = request.headers.get("origin")
    if origin is None:
        return False
    hosts = {request.headers.get("host"), request.headers.get("x-forwarded-host")} - {None}
    return origin == "null" or urlsplit(origin).netloc not in hosts


def _html(title: str, body: str, status: int = 200) -> Response:
    page = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width"><style>{STYLE}</style></head><body>{body}</body></html>')
    return Response(page.encode(), status_code=status, media_type="text/html; charset=utf-8",
                    headers={"cache-control": "no-store", "x-frame-options": "DENY",
                             "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; "
                             "form-action 'self'; img-src 'self'"})


def _nav(tenant: str, since: str, tenants: Sequence[str]) -> str:
    ranges = " · ".join(f'<a href="/keel/?tenant={quote(tenant)}&since={r}">{r}</a>' if r != since else f"<b>{r}</b>"
                        for r in RANGES)
    others = " ".join(f'<a href="/keel/?tenant={quote(t)}&since={since}">{escape(t)}</a>' for t in tenants
                      if t != tenant)
    return (f'<header><h1><a href="/keel/?tenant={quote(tenant)}&since={since}">Keel</a> · tenant '
            f'<span data-figure="tenant">{escape(tenant)}</span></h1><span>{ranges}</span><span>{others}</span>'
            '<form class="inline" method="post" action="/keel/logout"><button>Sign out</button></form></header>')


def _usd(value: float) -> str:
    sign = "−" if value < 0 and round(value, 4) != 0 else ""
    return f"{sign}${abs(value):,.4f}" if abs(value) < 100 else f"{sign}${abs(value):,.2f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def _signed(value: float, text: str) -> str:
    return f'<span class="{"pos" if value > 0 else "neg" if value < 0 else ""}">{text}</span>'


def _bars(rows: Sequence[tuple[str, float, str]], width: int = 560, unit: str = "$") -> str:
    """Horizontal bars from zero (negative ones to the left), labelled."""
    if not rows:
        return ""
    top = max(abs(v) for _, v, _ in rows) or 1.0
    left, span, height = 190, width - 290, 26
    zero = left + (span / 2 if any(v < 0 for _, v, _ in rows) else 0)
    scale = (span / 2 if zero > left else span) / top
    parts = [f'<svg width="{width}" height="{len(rows) * height + 10}" role="img">']
    for i, (label, value, color) in enumerate(rows):
        y = 5 + i * height
        x, w = (zero, value * scale) if value >= 0 else (zero + value * scale, -value * scale)
        text = _usd(value) if unit == "$" else f"{value:,.0f}"
        parts.append(f'<text x="{left - 8}" y="{y + 16}" text-anchor="end" font-size="12">{escape(label)}</text>'
                     f'<rect x="{x:.1f}" y="{y + 3}" width="{max(w, 1):.1f}" height="{height - 8}" fill="{color}"/>'
                     f'<text x="{max(x + w, zero) + 6:.1f}" y="{y + 16}" font-size="12">{text}</text>')
    parts.append(f'<line x1="{zero}" x2="{zero}" y1="0" y2="{len(rows) * height + 10}" stroke="#999"/></svg>')
    return "".join(parts)


def _days_chart(days: Sequence[JsonObject], width: int = 560, height: int = 160) -> str:
    """Input tokens per day, direct (grey) next to through Keel (blue)."""
    if not days:
        return ""
    top = max(max(d.get("input_direct", 0), d.get("input_keel", 0)) for d in days) or 1
    slot = (width - 40) / len(days)
    bar = max(2.0, min(18.0, slot / 3))
    parts = [f'<svg width="{width}" height="{height + 24}" role="img" aria-label="input tokens per day">']
    for i, d in enumerate(days):
        x = 30 + i * slot
        for j, (name, color) in enumerate((("input_direct", "#afb8c1"), ("input_keel", "#0969da"))):
            h = d.get(name, 0) / top * height
            parts.append(f'<rect x="{x + j * bar:.1f}" y="{height - h + 4:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                         f'fill="{color}"><title>{d["day"]} {name}: {d.get(name, 0):,.0f}</title></rect>')
        if len(days) <= 10 or i % max(1, len(days) // 8) == 0:
            parts.append(f'<text x="{x:.1f}" y="{height + 20}" font-size="10">{d["day"][5:]}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _overview(r: JsonObject, since: str) -> str:
    tokens, dollars, cached, memory = r["input_tokens"], r["dollars"], r["cached_fraction"], r["memory_gate"]
    recall, search = r["first_shot_recall"], r["tool_search"]
    cards = [
        ("usd_saved", _usd(dollars["saved"]), f"saved ({_pct(dollars['saved_fraction'])} of direct)"),
        ("usd_direct", _usd(dollars["direct"]), "direct (estimated)"),
        ("usd_keel", _usd(dollars["keel"]), "through Keel"),
        ("input_direct", f"{tokens['direct']:,}", "input tokens direct"),
        ("input_keel", f"{tokens['keel']:,}", "input tokens through Keel"),
        ("cached_keel", _pct(cached["keel"]), f"cached through Keel (direct {_pct(cached['direct'])})"),
        ("recall", _pct(recall["recall"]), f"first-shot recall ({recall['first_shot']}/{recall['calls']} calls)"),
        ("rounds", str(search["rounds"]), f"tool_search rounds ({search['turns_with_rounds']} turns)"),
        ("turns", str(r["turns"]), "turns"),
    ]
    out = ['<main><div class="cards">']
    out += [f'<div class="card"><b data-figure="{k}">{escape(v)}</b><span>{escape(s)}</span></div>'
            for k, v, s in cards]
    out.append("</div><h2>Dollars, direct vs through Keel</h2>")
    out.append(_bars([("direct", dollars["direct"], "#afb8c1"), ("through Keel", dollars["keel"], "#0969da")]))
    out.append("<h2>Saved, by cause</h2>")
    causes = dollars["by_cause"]
    out.append(_bars([(CAUSE_LABELS[c], v, "#1a7f37" if v >= 0 else "#cf222e") for c, v in causes.items()]))
    rows = "".join(f'<tr><td class="l">{CAUSE_LABELS[c]}</td><td data-figure="cause_{c}">{_signed(v, _usd(v))}</td>'
                   f'<td>{_cause_tokens(c, tokens)}</td></tr>' for c, v in causes.items())
    out.append(f'<table><tr><th class="l">cause</th><th>dollars</th><th>input tokens</th></tr>{rows}</table>')
    out.append(f"<h2>Input tokens per day ({escape(since)})</h2>" + _days_chart(r["days"]))
    gate = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in r["tool_gate"].items() if v) or "—"
    out.append("<h2>Decisions</h2><table>"
               f'<tr><td class="l">tool gate</td><td class="l" data-figure="tool_gate">{escape(gate)}</td></tr>'
               f'<tr><td class="l">memory gate</td><td class="l" data-figure="memory_gate">run {memory["run"]}, '
               f'skip {memory["skip"]}, failed {memory["failed"]}</td></tr>'
               f'<tr><td class="l">cached tokens</td><td class="l">direct {r["cached_tokens"]["direct"]:,}, through '
               f'Keel {r["cached_tokens"]["keel"]:,} (cache writes {r["cached_tokens"]["cache_write"]:,})</td></tr>'
               f'<tr><td class="l">cache misses</td><td class="l" data-figure="misses">{r["misses"]["planned"]} planned '
               f'(Keel changed the prefix on purpose), {r["misses"]["unexplained"]} with no reason Keel can see'
               "</td></tr></table>")
    out.append('<h2>Top conversations by cost</h2><table data-figure="top_conversations"><tr><th class="l">'
               "conversation</th><th>turns</th><th>input tokens</th><th>through Keel</th><th>direct</th>"
               "<th>saved</th></tr>")
    tenant = escape(r["tenant"])
    for c in r["top_conversations"]:
        link = f'/keel/conversation?tenant={quote(r["tenant"])}&since={quote(since)}&id={quote(c["conversation"])}'
        out.append(f'<tr><td class="l"><a href="{escape(link)}">{escape(c["conversation"][:24])}</a></td>'
                   f'<td>{c["turns"]}</td><td>{c["input_keel"]:,}</td><td>{_usd(c["usd_keel"])}</td>'
                   f'<td>{_usd(c["usd_direct"])}</td><td>{_signed(c["saved"], _usd(c["saved"]))}</td></tr>')
    out.append(f"</table><p><small>Tenant {tenant}. Direct figures are estimates: see the README, "
               "“How the savings are computed”.</small></p></main>")
    return "".join(out)


def _cause_tokens(cause: str, tokens: JsonObject) -> str:
    value = tokens["by_cause"].get(cause)
    return "" if value is None else f"{value:+,}"


def _inspector(conversation: str, turns: Sequence[TurnFacts]) -> str:
    out = [f'<main><h2>Conversation <code data-figure="conversation">{escape(conversation)}</code>: '
           f'<span data-figure="turn_count">{len(turns)}</span> turns</h2>']
    if not turns:
        return out[0] + "<p>No turns recorded for this conversation (or they have expired).</p></main>"
    out.append('<table data-figure="turns"><tr><th>#</th><th class="l">when, kind</th><th>input<br>Keel / direct</th>'
               "<th>cached<br>Keel / direct</th><th>$ Keel / direct</th><th class=\"l\">tools shipped (score)</th>"
               '<th class="l">search, calls</th><th class="l">context update</th><th class="l">cache</th></tr>')
    for n, t in enumerate(turns, 1):
        when = time.strftime("%m-%d %H:%M:%S", time.gmtime(t.at))
        shipped = ", ".join(f"{escape(s)}" + (f" ({t.scores[s]:.2f})" if s in t.scores else "") for s in t.surfaced)
        tools = (f"{len(t.surfaced)}/{t.offered} {escape(t.tools_outcome or '')}<br><small>{shipped}</small>"
                 if t.offered else "—")
        called = ", ".join(escape(c) + (" ✓" if c in t.surfaced else " (searched)") for c in t.called) or "none"
        search = (f'<span data-figure="rounds">{t.rounds}</span> rounds'
                  + (f", found {escape(', '.join(t.found))}" if t.found else "") + f"<br>calls: {called}")
        update = f"<pre>{escape(t.context_update)}</pre>" if t.context_update else "—"
        cache = [f"{t.breakpoints} breakpoints added"] if t.breakpoints else []
        cache += [f"key {escape(t.prompt_cache_key[:18])}…"] if t.prompt_cache_key else []
        if t.notes:
            cache.append("prefix changed: " + escape(", ".join(t.notes)))
        if t.missed:
            cache.append('<span class="neg">miss</span>' + ("" if t.notes else " (no reason Keel can see)"))
        out.append(
            f'<tr><td>{n}</td><td class="l">{when}<br>{escape(t.kind.replace("_", " "))}{" · stream" if t.stream else ""}<br>'
            f'<small>{escape(t.model)}</small></td><td>{t.usage.input:,} / {t.direct.input:,}</td>'
            f"<td>{t.usage.cached:,} / {t.direct_cached:,}</td>"
            f'<td>{_usd(t.keel_usd)} / {_usd(t.direct_usd)}</td><td class="l">{tools}</td><td class="l">{search}</td>'
            f'<td class="l">{update}</td><td class="l">{"<br>".join(cache) or "—"}</td></tr>')
    out.append("</table></main>")
    return "".join(out)
