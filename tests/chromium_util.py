"""A real headless Chromium (Debian's ``chromium`` package) driven over the DevTools protocol
with aiohttp's websocket client: navigate, evaluate JavaScript, read cookies, screenshot."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import re
import shutil
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SKIP_REASON = (
    "no chromium on PATH: the status page is tested in a real browser; install Debian's "
    "`chromium` package (apt-get install -y chromium)"
)


class Chromium:
    """``async with Chromium(profile_dir) as browser``: one headless browser, one page."""

    def __init__(self, profile: Path, *, timeout: float = 20.0) -> None:
        self.profile = profile
        self.timeout = timeout
        self.events: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._proc: asyncio.subprocess.Process | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None

    async def __aenter__(self) -> Self:
        assert CHROMIUM is not None, SKIP_REASON
        self._proc = await asyncio.create_subprocess_exec(
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # tests may run as root, where the sandbox refuses to start
            "--disable-gpu",
            "--no-first-run",
            "--window-size=1200,700",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={self.profile}",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(self.timeout):
                port = await self._devtools_port()
                self._session = aiohttp.ClientSession()
                async with self._session.get(f"http://127.0.0.1:{port}/json/list") as resp:
                    targets = await resp.json()
                page = next(t for t in targets if t.get("type") == "page")
                self._ws = await self._session.ws_connect(
                    page["webSocketDebuggerUrl"], max_msg_size=64 * 1024 * 1024
                )
                await self.send("Page.enable")
                await self.send("Network.enable")
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _devtools_port(self) -> int:
        assert self._proc is not None and self._proc.stderr is not None
        while True:
            line = (await self._proc.stderr.readline()).decode(errors="replace")
            if not line:
                raise RuntimeError("chromium exited before its DevTools endpoint was up")
            found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if found:
                return int(found.group(1))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._session is not None:
            await self._session.close()
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._proc.wait(), 10)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Call a DevTools method; its ``result`` (events that arrive meanwhile are kept)."""
        assert self._ws is not None
        call_id = next(self._ids)
        await self._ws.send_str(json.dumps({"id": call_id, "method": method, "params": params}))
        async with asyncio.timeout(self.timeout):
            while True:
                message = await self._next()
                if message.get("id") == call_id:
                    if "error" in message:
                        raise RuntimeError(f"{method}: {message['error']}")
                    result: dict[str, Any] = message.get("result", {})
                    return result

    async def _next(self) -> dict[str, Any]:
        assert self._ws is not None
        raw = await self._ws.receive()
        if raw.type != aiohttp.WSMsgType.TEXT:
            raise RuntimeError(f"the DevTools connection closed ({raw.type})")
        message: dict[str, Any] = json.loads(raw.data)
        if "method" in message:
            self.events.append(message)
        return message

    async def wait_for_load(self, since: int) -> None:
        """Until a ``Page.loadEventFired`` arrives after the first ``since`` events."""
        async with asyncio.timeout(self.timeout):
            while not any(e["method"] == "Page.loadEventFired" for e in self.events[since:]):
                await self._next()

    async def navigate(self, url: str) -> None:
        since = len(self.events)
        await self.send("Page.navigate", url=url)
        await self.wait_for_load(since)

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def submit(self, expression: str) -> None:
        """Run ``expression`` (which submits a form) and wait for the page it leads to."""
        since = len(self.events)
        await self.evaluate(expression)
        await self.wait_for_load(since)

    async def cookies(self) -> list[dict[str, Any]]:
        return list((await self.send("Network.getCookies"))["cookies"])

    async def screenshot(self, path: Path) -> Path:
        data = (await self.send("Page.captureScreenshot", format="png"))["data"]
        await asyncio.to_thread(path.write_bytes, base64.b64decode(data))
        return path
