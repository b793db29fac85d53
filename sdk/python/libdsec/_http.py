"""The blocking transport: a thread-safe pool of keep-alive
``http.client`` connections, one request at a time on each."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from typing import Dict, Iterator, List, Optional, Tuple
from urllib.parse import urlsplit

from .errors import DsecConnectionError, DsecTimeoutError

# Errors that mean the connection is gone. On a connection taken from the
# pool they usually mean the server closed it while idle: the request never
# reached it, so it is sent again once on a fresh connection.
STALE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, http.client.RemoteDisconnected,
         http.client.BadStatusLine)


class Response:
    """An answer. Read it whole with :meth:`read`, or line by line with
    :meth:`iter_lines` (streams); the connection goes back to the pool once
    the body is read to its end."""

    def __init__(self, pool: "Pool", conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self.status = resp.status
        self.reason = resp.reason
        self.headers: Dict[str, str] = {k.lower(): v for k, v in resp.getheaders()}
        self._pool, self._conn, self._resp = pool, conn, resp
        self._done = False

    def read(self) -> bytes:
        try:
            data = self._resp.read()
        except socket.timeout as e:
            self.close()
            raise DsecTimeoutError("timed out reading the answer") from e
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise DsecConnectionError(f"connection broke reading the answer: {e}") from e
        self._finish()
        return data

    def iter_lines(self, timeout: Optional[float] = None) -> Iterator[bytes]:
        """Yields the body's lines (without the newline); ``timeout`` bounds
        the wait for each."""
        if timeout is not None and self._conn.sock is not None:
            self._conn.sock.settimeout(timeout)
        try:
            while True:
                line = self._resp.readline()
                if not line:
                    break
                line = line.rstrip(b"\r\n")
                if line:
                    yield line
        except socket.timeout as e:
            self.close()
            raise DsecTimeoutError("timed out waiting for the next event of a stream") from e
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise DsecConnectionError(f"connection broke mid-stream: {e}") from e
        self._finish()

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        if self._resp.will_close or not self._resp.isclosed():
            self._conn.close()
        else:
            self._pool._put(self._conn)

    def close(self) -> None:
        """Drops the connection unless the body was read to its end."""
        if not self._done:
            self._done = True
            self._conn.close()

    def __enter__(self) -> "Response":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Pool:
    """Keep-alive connections to one server."""

    def __init__(self, base_url: str, *, max_idle: int = 32, connect_timeout: float = 10.0,
                 ssl_context: Optional[ssl.SSLContext] = None) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"bad server URL {base_url!r}: want http://host:port")
        self.scheme, self.host = u.scheme, u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.host_header = u.netloc
        self._ssl = ssl_context
        self._connect_timeout = connect_timeout
        self._max_idle = max_idle
        self._idle: List[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def _new(self) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=self._connect_timeout,
                                               context=self._ssl or ssl.create_default_context())
        return http.client.HTTPConnection(self.host, self.port, timeout=self._connect_timeout)

    def _get(self) -> Tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._new(), False

    def _put(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def request(self, method: str, target: str, headers: Dict[str, str], body: Optional[bytes],
                timeout: float) -> Response:
        """Sends one request and returns its answer (status and headers read,
        the body not yet). Raises DsecConnectionError or DsecTimeoutError."""
        for attempt in (0, 1):
            conn, reused = self._get()
            try:
                if conn.sock is None:
                    conn.connect()
                conn.sock.settimeout(timeout)
                conn.request(method, self.prefix + target, body=body, headers=headers)
                resp = conn.getresponse()
                return Response(self, conn, resp)
            except socket.timeout as e:
                conn.close()
                raise DsecTimeoutError(f"{method} {target}: no answer within {timeout:g}s") from e
            except STALE as e:
                conn.close()
                if reused and attempt == 0:
                    continue
                raise DsecConnectionError(f"{method} {target}: {e!r}") from e
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise DsecConnectionError(f"{method} {target}: {e}") from e
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Closes every idle connection; later requests open new ones."""
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()
