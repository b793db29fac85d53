"""The asyncio transport: a small HTTP/1.1 client over
``asyncio.open_connection`` with a pool of keep-alive connections. It speaks
what the dsec server sends: Content-Length and chunked bodies (streams), and
``Connection: close``."""

from __future__ import annotations

import asyncio
import ssl
from typing import AsyncIterator, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from .errors import DsecConnectionError, DsecTimeoutError

_LIMIT = 1 << 20  # longest header line


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # the loop may be gone already
            pass


class AsyncResponse:
    """An answer with its status and headers read; the body is read with
    :meth:`read` or :meth:`iter_lines`/:meth:`iter_chunks`."""

    def __init__(self, pool: "AsyncPool", conn: _Conn, status: int, reason: str, headers: Dict[str, str],
                 method: str) -> None:
        self.status, self.reason, self.headers = status, reason, headers
        self._pool, self._conn = pool, conn
        self._done = False
        te = headers.get("transfer-encoding", "").lower()
        self._chunked = "chunked" in te
        cl = headers.get("content-length")
        self._left: Optional[int] = int(cl) if cl is not None and not self._chunked else None
        self._keep = headers.get("connection", "").lower() != "close"
        if method == "HEAD" or status in (204, 304) or (100 <= status < 200):
            self._left = 0
            self._chunked = False
        if self._left is None and not self._chunked:
            self._keep = False  # body ends at EOF
        self._chunk_left = 0
        self._eof = False

    async def _read_some(self, n: int = 65536) -> bytes:
        """Up to n body bytes; b"" at the end of the body."""
        r = self._conn.reader
        if self._eof:
            return b""
        if self._chunked:
            if self._chunk_left == 0:
                line = await r.readline()
                if not line:
                    raise DsecConnectionError("connection closed inside a chunked body")
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while True:  # trailers, then the blank line
                        t = await r.readline()
                        if t in (b"\r\n", b"\n", b""):
                            break
                    self._eof = True
                    return b""
                self._chunk_left = size
            data = await r.read(min(n, self._chunk_left))
            if not data:
                raise DsecConnectionError("connection closed inside a chunk")
            self._chunk_left -= len(data)
            if self._chunk_left == 0:
                await r.readexactly(2)
            return data
        if self._left is not None:
            if self._left == 0:
                self._eof = True
                return b""
            data = await r.read(min(n, self._left))
            if not data:
                raise DsecConnectionError("connection closed before the end of the body")
            self._left -= len(data)
            return data
        data = await r.read(n)
        if not data:
            self._eof = True
        return data

    async def read(self, timeout: Optional[float] = None) -> bytes:
        """The whole body."""
        parts: List[bytes] = []

        async def all_() -> None:
            while True:
                b = await self._read_some()
                if not b:
                    return
                parts.append(b)

        await self._guard(all_(), timeout)
        self._finish()
        return b"".join(parts)

    async def iter_chunks(self, timeout: Optional[float] = None) -> AsyncIterator[bytes]:
        """The body as it comes; ``timeout`` bounds the wait for each piece."""
        while True:
            b = await self._guard(self._read_some(), timeout)
            if not b:
                break
            yield b
        self._finish()

    async def iter_lines(self, timeout: Optional[float] = None) -> AsyncIterator[bytes]:
        """The body's non-empty lines, without newlines."""
        buf = b""
        async for chunk in self.iter_chunks(timeout):
            buf += chunk
            while True:
                i = buf.find(b"\n")
                if i < 0:
                    break
                line, buf = buf[:i].rstrip(b"\r"), buf[i + 1:]
                if line:
                    yield line
        if buf.strip():
            yield buf.strip()

    async def _guard(self, aw, timeout: Optional[float]):  # type: ignore[no-untyped-def]
        try:
            if timeout is None:
                return await aw
            return await asyncio.wait_for(aw, timeout)
        except asyncio.TimeoutError as e:
            self.close()
            raise DsecTimeoutError("timed out reading the answer") from e
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            self.close()
            raise DsecConnectionError(f"connection broke reading the answer: {e!r}") from e
        except DsecConnectionError:
            self.close()
            raise

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        if self._keep and self._eof:
            self._pool._put(self._conn)
        else:
            self._conn.close()

    def close(self) -> None:
        """Drops the connection unless the body was read to its end."""
        if not self._done:
            self._done = True
            self._conn.close()


class AsyncPool:
    """Keep-alive connections to one server, for one event loop."""

    def __init__(self, base_url: str, *, max_idle: int = 64, connect_timeout: float = 10.0,
                 ssl_context: Optional[ssl.SSLContext] = None) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"bad server URL {base_url!r}: want http://host:port")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.host_header = u.netloc
        self._ssl = (ssl_context or ssl.create_default_context()) if u.scheme == "https" else None
        self._connect_timeout = connect_timeout
        self._max_idle = max_idle
        self._idle: List[_Conn] = []

    def _put(self, conn: _Conn) -> None:
        if len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.close()

    async def _get(self) -> Tuple[_Conn, bool]:
        while self._idle:
            c = self._idle.pop()
            if not c.reader.at_eof():
                return c, True
            c.close()
        try:
            r, w = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self._ssl, limit=_LIMIT), self._connect_timeout)
        except asyncio.TimeoutError as e:
            raise DsecTimeoutError(f"connect to {self.host}:{self.port}: timed out") from e
        except OSError as e:
            raise DsecConnectionError(f"connect to {self.host}:{self.port}: {e}") from e
        return _Conn(r, w), False

    async def request(self, method: str, target: str, headers: Dict[str, str], body: Optional[bytes],
                      timeout: float) -> AsyncResponse:
        """Sends one request; returns when status and headers are in."""
        lines = [f"{method} {self.prefix}{target} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None or method in ("POST", "PUT"):
            lines.append(f"Content-Length: {len(body or b'')}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        for attempt in (0, 1):
            conn, reused = await self._get()
            try:
                return await asyncio.wait_for(self._exchange(conn, method, head, body), timeout)
            except asyncio.TimeoutError as e:
                conn.close()
                raise DsecTimeoutError(f"{method} {target}: no answer within {timeout:g}s") from e
            except (ConnectionError, asyncio.IncompleteReadError, _Stale) as e:
                conn.close()
                if reused and attempt == 0:
                    continue  # the server closed it while idle
                raise DsecConnectionError(f"{method} {target}: {e!r}") from e
            except (OSError, ValueError) as e:
                conn.close()
                raise DsecConnectionError(f"{method} {target}: {e!r}") from e
        raise AssertionError("unreachable")

    async def _exchange(self, conn: _Conn, method: str, head: bytes, body: Optional[bytes]) -> AsyncResponse:
        conn.writer.write(head + (body or b""))
        await conn.writer.drain()
        status_line = await conn.reader.readline()
        if not status_line:
            raise _Stale("connection closed before an answer")
        parts = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise ValueError(f"bad status line {status_line!r}")
        status = int(parts[1])
        reason = parts[2] if len(parts) > 2 else ""
        headers: Dict[str, str] = {}
        while True:
            line = await conn.reader.readline()
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise ConnectionResetError("connection closed inside the headers")
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        return AsyncResponse(self, conn, status, reason, headers, method)

    async def close(self) -> None:
        """Closes every idle connection."""
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()
            try:
                await c.writer.wait_closed()
            except Exception:
                pass


class _Stale(Exception):
    """A pooled connection turned out to be closed."""
