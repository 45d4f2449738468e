"""Headless Chromium driven over its DevTools protocol (Debian's `chromium`; nothing else to install)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--window-size=1280,1600", "--remote-debugging-port=0"]


def chromium_or_skip() -> str:
    """The chromium binary; without one the test is skipped (a failure under CI, which installs it)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed and CI is set (.ci/run installs it)")
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run does)")
    return found


class Browser:
    """One headless Chromium with a fresh profile, one page, driven by CDP commands."""

    def __init__(self, binary: str, profile: Path) -> None:
        self.binary, self.profile = binary, profile
        self.process: subprocess.Popen[bytes] | None = None
        self.session: aiohttp.ClientSession | None = None
        self.ws: Any = None
        self._ids = itertools.count(1)
        self._events: list[dict[str, Any]] = []

    async def __aenter__(self) -> Browser:
        self.process = subprocess.Popen([self.binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.is_file() or len(port_file.read_text().splitlines()) < 2:
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("chromium did not start its DevTools endpoint")
            await asyncio.sleep(0.1)
        port = port_file.read_text().splitlines()[0]
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json()
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = await self.session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        await self.send("Page.enable")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        call = next(self._ids)
        await self.ws.send_json({"id": call, "method": method, "params": params})
        while True:
            message = await asyncio.wait_for(self.ws.receive_json(), 30)
            if message.get("id") == call:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self._events.append(message)

    async def loaded(self) -> None:
        """Wait for the next page load (a navigation, a form post, a click on a link)."""
        while True:
            for n, event in enumerate(self._events):
                if event.get("method") == "Page.loadEventFired":
                    del self._events[: n + 1]
                    return
            self._events.append(await asyncio.wait_for(self.ws.receive_json(), 30))

    async def goto(self, url: str) -> None:
        self._events.clear()
        await self.send("Page.navigate", url=url)
        await self.loaded()

    async def js(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def act(self, expression: str) -> None:
        """Run something that navigates (submit a form, click a link) and wait for the new page."""
        self._events.clear()
        await self.js(expression)
        await self.loaded()

    async def figures(self) -> dict[str, str]:
        """Every element's text marked data-figure, by its name."""
        found: dict[str, str] = await self.js(
            "Object.fromEntries([...document.querySelectorAll('[data-figure]')]"
            ".map(e => [e.dataset.figure, e.innerText.trim()]))")
        return found

    async def screenshot(self, path: Path) -> Path:
        data = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path
