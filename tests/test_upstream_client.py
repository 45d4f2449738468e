"""The httpx upstream client alone (respx): headers as given, failures translated once."""

from __future__ import annotations

import httpx
import pytest
import respx

from proxy.config import ServerConfig
from proxy.errors import UpstreamConnectError, UpstreamTimeoutError
from proxy.upstream_httpx import HttpxUpstream

URL = "https://provider.example/v1/chat/completions"


@respx.mock
async def test_sends_only_given_headers() -> None:
    """No client default headers (user-agent, accept-encoding) are added to what we send."""
    route = respx.post(URL).mock(return_value=httpx.Response(200, content=b"{}"))
    upstream = HttpxUpstream(ServerConfig())
    response = await upstream.open("POST", URL, {"authorization": "Bearer k", "x-a": "1"}, b"{}")
    assert await response.read() == b"{}"
    sent = route.calls.last.request.headers
    assert "user-agent" not in sent and "accept-encoding" not in sent and sent["x-a"] == "1"
    await upstream.aclose()


@pytest.mark.parametrize(
    "exc, error, words",
    [
        (httpx.ConnectError("refused"), UpstreamConnectError, "unreachable"),
        (httpx.ConnectTimeout("slow"), UpstreamTimeoutError, "connecting to"),
        (httpx.ReadTimeout("slow"), UpstreamTimeoutError, "waiting for a response"),
        (httpx.PoolTimeout("busy"), UpstreamTimeoutError, "free connection"),
        (httpx.RemoteProtocolError("reset"), UpstreamConnectError, "reset"),
        (httpx.ReadError("reset"), UpstreamConnectError, "reset"),
    ],
)
@respx.mock
async def test_failures_translated(exc: Exception, error: type[Exception], words: str) -> None:
    respx.post(URL).mock(side_effect=exc)
    upstream = HttpxUpstream(ServerConfig())
    with pytest.raises(error) as info:
        await upstream.open("POST", URL, {}, b"{}")
    assert words in str(info.value) and "provider.example" in str(info.value)
    await upstream.aclose()


@respx.mock
async def test_one_pooled_client_per_origin() -> None:
    respx.get(url__startswith="https://").mock(return_value=httpx.Response(200))
    upstream = HttpxUpstream(ServerConfig())
    for url in ("https://a.example/v1/models", "https://a.example/v1/files", "https://b.example/v1/models"):
        await (await upstream.open("GET", url, {}, None)).aclose()
    assert len(upstream._clients) == 2
    await upstream.aclose()
