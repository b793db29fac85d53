"""A small WebSocket client (RFC 6455) on the standard library, blocking
and asyncio: what terminals and port tunnels speak. It sends masked frames,
reassembles fragmented messages, answers pings and closes cleanly; it does
no compression and no extensions."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import socket
import ssl
import struct
from typing import Dict, Optional, Tuple
from urllib.parse import urlsplit

from .errors import ApiError, DsecConnectionError, DsecError, DsecTimeoutError, error_from_code, error_from_response

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
# Messages larger than this are refused (a terminal's output comes in
# frames of at most 32 KiB).
MAX_MESSAGE = 16 << 20


class Closed(Exception):
    """The peer closed the WebSocket: ``code`` and ``reason`` from its close
    frame (1005 when it gave none, 1006 when the connection just broke)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"websocket closed: {code} {reason}")
        self.code, self.reason = code, reason

    def api_error(self) -> ApiError:
        """The close as an API error: 1008 (policy) means a bad request."""
        code = "invalid_argument" if self.code == 1008 else "unavailable" if self.code in (1001, 1006) else "internal"
        return error_from_code(code, self.reason or f"websocket closed with code {self.code}")


def encode_frame(opcode: int, payload: bytes) -> bytes:
    """A final, masked frame (clients must mask)."""
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    mask = os.urandom(4)
    if n:
        # XOR with the mask repeated, as one big integer: fast enough.
        m = (mask * (n // 4 + 1))[:n]
        payload = (int.from_bytes(payload, "big") ^ int.from_bytes(m, "big")).to_bytes(n, "big")
    return head + mask + payload


def close_payload(code: int, reason: str) -> bytes:
    return struct.pack("!H", code) + reason.encode()[:120]


def parse_close(payload: bytes) -> Tuple[int, str]:
    if len(payload) < 2:
        return 1005, ""
    return struct.unpack("!H", payload[:2])[0], payload[2:].decode("utf-8", "replace")


def handshake(host_header: str, target: str, headers: Dict[str, str]) -> Tuple[bytes, str]:
    """The upgrade request and the accept value the answer must carry."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [f"GET {target} HTTP/1.1", f"Host: {host_header}", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    accept = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()
    return ("\r\n".join(lines) + "\r\n\r\n").encode(), accept


def parse_head(head: bytes) -> Tuple[int, str, Dict[str, str]]:
    lines = head.decode("iso-8859-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise DsecConnectionError(f"bad answer to a websocket upgrade: {lines[0]!r}")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return int(parts[1]), parts[2] if len(parts) > 2 else "", headers


def check_accept(headers: Dict[str, str], accept: str) -> None:
    if headers.get("sec-websocket-accept") != accept:
        raise DsecConnectionError("websocket upgrade: wrong Sec-WebSocket-Accept")


class _Reader:
    """Reassembles messages from frames read by ``read(n)``."""

    @staticmethod
    def header(b: bytes) -> Tuple[bool, int, bool, int]:
        fin, opcode = bool(b[0] & 0x80), b[0] & 0x0F
        return fin, opcode, bool(b[1] & 0x80), b[1] & 0x7F


class WebSocket:
    """A blocking WebSocket over a connected socket."""

    def __init__(self, sock: socket.socket, buffered: bytes = b"") -> None:
        self._sock, self._buf = sock, bytearray(buffered)
        self.closed: Optional[Closed] = None

    @classmethod
    def connect(cls, base_url: str, target: str, headers: Dict[str, str], timeout: float,
                ssl_context: Optional[ssl.SSLContext] = None) -> "WebSocket":
        u = urlsplit(base_url)
        port = u.port or (443 if u.scheme == "https" else 80)
        try:
            sock = socket.create_connection((u.hostname, port), timeout=timeout)
            if u.scheme == "https":
                sock = (ssl_context or ssl.create_default_context()).wrap_socket(sock, server_hostname=u.hostname)
        except socket.timeout as e:
            raise DsecTimeoutError(f"connect to {u.netloc}: timed out") from e
        except OSError as e:
            raise DsecConnectionError(f"connect to {u.netloc}: {e}") from e
        req, accept = handshake(u.netloc, u.path.rstrip("/") + target, headers)
        ws = cls(sock)
        try:
            sock.sendall(req)
            while b"\r\n\r\n" not in ws._buf:
                ws._fill()
            i = ws._buf.index(b"\r\n\r\n")
            head, ws._buf = bytes(ws._buf[:i]), ws._buf[i + 4:]
            status, reason, hdrs = parse_head(head)
            if status != 101:
                n = int(hdrs.get("content-length", "0") or 0)
                while len(ws._buf) < n:
                    ws._fill()
                raise error_from_response(status, bytes(ws._buf[:n]), reason)
            check_accept(hdrs, accept)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return ws

    def _fill(self) -> None:
        try:
            b = self._sock.recv(65536)
        except socket.timeout as e:
            raise DsecTimeoutError("websocket: timed out waiting for data") from e
        except OSError as e:
            raise DsecConnectionError(f"websocket: {e}") from e
        if not b:
            raise Closed(1006, "connection closed without a close frame")
        self._buf += b

    def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            self._fill()
        b = bytes(self._buf[:n])
        del self._buf[:n]
        return b

    def send(self, opcode: int, payload: bytes) -> None:
        try:
            self._sock.sendall(encode_frame(opcode, payload))
        except OSError as e:
            raise DsecConnectionError(f"websocket: {e}") from e

    def recv(self, timeout: Optional[float] = None) -> Tuple[int, bytes]:
        """The next message: (OP_TEXT or OP_BINARY, payload). Raises
        :class:`Closed` when the peer closes (after answering its close)."""
        if self.closed:
            raise self.closed
        self._sock.settimeout(timeout)
        msg_op, parts = None, []
        while True:
            fin, op, masked, n = _Reader.header(self._read(2))
            if n == 126:
                n = struct.unpack("!H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._read(8))[0]
            if n > MAX_MESSAGE:
                raise DsecConnectionError(f"websocket: frame of {n} bytes")
            mask = self._read(4) if masked else b""
            data = self._read(n)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            if op == OP_PING:
                self.send(OP_PONG, data)
            elif op == OP_PONG:
                pass
            elif op == OP_CLOSE:
                code, reason = parse_close(data)
                try:
                    self.send(OP_CLOSE, data[:2])
                except DsecConnectionError:
                    pass
                self._sock.close()
                self.closed = Closed(code, reason)
                raise self.closed
            else:
                if op != OP_CONT:
                    msg_op, parts = op, []
                parts.append(data)
                if fin:
                    return msg_op or OP_BINARY, b"".join(parts)

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Sends a close frame and waits briefly for the peer's."""
        if self.closed:
            return
        try:
            self.send(OP_CLOSE, close_payload(code, reason))
            while True:
                self.recv(timeout=5)
        except (Closed, DsecError, OSError):
            pass
        finally:
            self._sock.close()
            if not self.closed:
                self.closed = Closed(code, reason)


class AsyncWebSocket:
    """The asyncio twin of :class:`WebSocket`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._r, self._w = reader, writer
        self.closed: Optional[Closed] = None

    @classmethod
    async def connect(cls, base_url: str, target: str, headers: Dict[str, str], timeout: float,
                      ssl_context: Optional[ssl.SSLContext] = None) -> "AsyncWebSocket":
        u = urlsplit(base_url)
        port = u.port or (443 if u.scheme == "https" else 80)
        ctx = (ssl_context or ssl.create_default_context()) if u.scheme == "https" else None
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(u.hostname, port, ssl=ctx), timeout)
        except asyncio.TimeoutError as e:
            raise DsecTimeoutError(f"connect to {u.netloc}: timed out") from e
        except OSError as e:
            raise DsecConnectionError(f"connect to {u.netloc}: {e}") from e
        req, accept = handshake(u.netloc, u.path.rstrip("/") + target, headers)
        try:
            w.write(req)
            head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), timeout)
            status, reason, hdrs = parse_head(head[:-4])
            if status != 101:
                n = int(hdrs.get("content-length", "0") or 0)
                body = await asyncio.wait_for(r.readexactly(n), timeout) if n else b""
                raise error_from_response(status, body, reason)
            check_accept(hdrs, accept)
        except (asyncio.IncompleteReadError, OSError) as e:
            w.close()
            raise DsecConnectionError(f"websocket upgrade: {e}") from e
        except BaseException:
            w.close()
            raise
        return cls(r, w)

    async def _read(self, n: int) -> bytes:
        try:
            return await self._r.readexactly(n)
        except asyncio.IncompleteReadError as e:
            raise Closed(1006, "connection closed without a close frame") from e
        except OSError as e:
            raise DsecConnectionError(f"websocket: {e}") from e

    async def send(self, opcode: int, payload: bytes) -> None:
        try:
            self._w.write(encode_frame(opcode, payload))
            await self._w.drain()
        except OSError as e:
            raise DsecConnectionError(f"websocket: {e}") from e

    async def recv(self) -> Tuple[int, bytes]:
        if self.closed:
            raise self.closed
        msg_op, parts = None, []
        while True:
            fin, op, masked, n = _Reader.header(await self._read(2))
            if n == 126:
                n = struct.unpack("!H", await self._read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", await self._read(8))[0]
            if n > MAX_MESSAGE:
                raise DsecConnectionError(f"websocket: frame of {n} bytes")
            mask = await self._read(4) if masked else b""
            data = await self._read(n)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            if op == OP_PING:
                await self.send(OP_PONG, data)
            elif op == OP_PONG:
                pass
            elif op == OP_CLOSE:
                code, reason = parse_close(data)
                try:
                    await self.send(OP_CLOSE, data[:2])
                except DsecConnectionError:
                    pass
                self._w.close()
                self.closed = Closed(code, reason)
                raise self.closed
            else:
                if op != OP_CONT:
                    msg_op, parts = op, []
                parts.append(data)
                if fin:
                    return msg_op or OP_BINARY, b"".join(parts)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.closed:
            return
        try:
            await self.send(OP_CLOSE, close_payload(code, reason))
            while True:
                await asyncio.wait_for(self.recv(), 5)
        except (Closed, DsecError, OSError, asyncio.TimeoutError):
            pass
        finally:
            self._w.close()
            if not self.closed:
                self.closed = Closed(code, reason)

