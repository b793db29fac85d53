"""Terminals: an interactive command on a pseudo-terminal in a sandbox,
over a WebSocket (``GET /v1/sandboxes/{id}/terminal``). Binary frames are
keystrokes in and output out; JSON text frames resize, signal and, last,
report the exit."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, Mapping, Optional, Sequence, Union
from urllib.parse import urlencode

from . import _ops
from .errors import DsecTimeoutError
from ._websocket import OP_BINARY, OP_TEXT, AsyncWebSocket, Closed, WebSocket

__all__ = ["Terminal", "AsyncTerminal"]


def terminal_target(sid: str, cmd: Union[str, Sequence[str], None], cwd: Optional[str],
                    env: Optional[Mapping[str, str]], rows: int, cols: int) -> str:
    q: list = []
    if isinstance(cmd, str):
        q += [("cmd", "/bin/sh"), ("cmd", "-c"), ("cmd", cmd)]
    elif cmd:
        q += [("cmd", a) for a in cmd]
    if cwd:
        q.append(("cwd", cwd))
    q += [("env", f"{k}={v}") for k, v in (env or {}).items()]
    q += [("rows", str(rows)), ("cols", str(cols))]
    return _ops.sb_path(sid, "terminal") + "?" + urlencode(q)


def _text(data: Union[bytes, str]) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


class _Common:
    exit_code: Optional[int]
    signal_name: Optional[str]

    def _on_text(self, payload: bytes) -> None:
        try:
            m: Dict[str, Any] = json.loads(payload)
        except ValueError:
            return
        if m.get("type") == "exit":
            self.exit_code = m.get("exit_code")
            self.signal_name = m.get("signal") or None

    def _on_close(self, c: Closed) -> bytes:
        if self.exit_code is not None or c.code == 1000:
            return b""
        raise c.api_error()


class Terminal(_Common):
    """A terminal in a sandbox (see :meth:`libdsec.Sandbox.terminal`).

    ``send`` types, ``recv`` returns output (``b""`` once the command has
    exited; then ``exit_code`` says how), ``resize`` and ``signal`` act on
    the terminal, ``close`` ends it (killing what still runs in it).
    """

    def __init__(self, ws: WebSocket) -> None:
        self._ws = ws
        self.exit_code = None
        self.signal_name = None

    def send(self, data: Union[bytes, str]) -> None:
        self._ws.send(OP_BINARY, _text(data))

    def recv(self, timeout: Optional[float] = None) -> bytes:
        """The next output (at least one byte), or ``b""`` at the end.
        Raises :class:`libdsec.DsecTimeoutError` after ``timeout`` seconds
        without output."""
        while True:
            try:
                op, payload = self._ws.recv(timeout)
            except Closed as c:
                return self._on_close(c)
            if op == OP_TEXT:
                self._on_text(payload)
            elif payload:
                return payload

    def read_all(self, timeout: Optional[float] = None) -> bytes:
        """Output until the command exits."""
        out = []
        while True:
            b = self.recv(timeout)
            if not b:
                return b"".join(out)
            out.append(b)

    def resize(self, rows: int, cols: int) -> None:
        self._ws.send(OP_TEXT, json.dumps({"type": "resize", "rows": rows, "cols": cols}).encode())

    def signal(self, sig: str = "INT") -> None:
        """Signals the terminal's foreground process group."""
        self._ws.send(OP_TEXT, json.dumps({"type": "signal", "signal": sig}).encode())

    def close(self) -> None:
        self._ws.close()

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncTerminal(_Common):
    """The asyncio twin of :class:`Terminal`."""

    def __init__(self, ws: AsyncWebSocket) -> None:
        self._ws = ws
        self.exit_code = None
        self.signal_name = None

    async def send(self, data: Union[bytes, str]) -> None:
        await self._ws.send(OP_BINARY, _text(data))

    async def recv(self, timeout: Optional[float] = None) -> bytes:
        """The next output (at least one byte), or ``b""`` at the end; see
        :meth:`Terminal.recv`."""
        while True:
            try:
                if timeout is None:
                    op, payload = await self._ws.recv()
                else:
                    try:
                        op, payload = await asyncio.wait_for(self._ws.recv(), timeout)
                    except asyncio.TimeoutError:
                        raise DsecTimeoutError(f"no terminal output for {timeout} s") from None
            except Closed as c:
                return self._on_close(c)
            if op == OP_TEXT:
                self._on_text(payload)
            elif payload:
                return payload

    async def read_all(self, timeout: Optional[float] = None) -> bytes:
        """Output until the command exits."""
        out = []
        while True:
            b = await self.recv(timeout)
            if not b:
                return b"".join(out)
            out.append(b)

    async def resize(self, rows: int, cols: int) -> None:
        await self._ws.send(OP_TEXT, json.dumps({"type": "resize", "rows": rows, "cols": cols}).encode())

    async def signal(self, sig: str = "INT") -> None:
        await self._ws.send(OP_TEXT, json.dumps({"type": "signal", "signal": sig}).encode())

    async def close(self) -> None:
        await self._ws.close()

    async def __aenter__(self) -> "AsyncTerminal":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
