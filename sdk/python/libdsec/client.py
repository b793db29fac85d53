"""The blocking client: :class:`Client` and the handles it returns
(:class:`Sandbox`, :class:`Process`, :class:`ExecStream`, :class:`BatchResult`).
Safe to share between threads: each call takes a keep-alive connection from
the pool and gives it back."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _ops
from ._admin import AdminCalls
from ._http import Pool, Response
from ._terminal import Terminal, terminal_target
from ._websocket import WebSocket
from ._retry import delay, should_retry
from .errors import ApiError, DsecError, error_from_response
from .models import (BatchItem, BatchProgress, ExecResult, FileInfo, Layer, OutputChunk, OutputPage, Pool as PoolInfo,
                     Health, ProcessInfo, Profile, SandboxInfo, TrajectoryLog, parse_exec_event, parse_output_event)

__all__ = ["Client", "Sandbox", "Process", "ExecStream", "BatchResult", "progress_bar"]

ProgressArg = Union[bool, Callable[[BatchProgress], None], None]


def progress_bar(stream: Any = None) -> Callable[[BatchProgress], None]:
    """A progress callback that draws a bar on ``stream`` (stderr)."""
    out = stream or sys.stderr
    start = time.monotonic()
    tty = hasattr(out, "isatty") and out.isatty()
    last = [0.0]

    def show(p: BatchProgress) -> None:
        now = time.monotonic()
        if not tty and now - last[0] < 2 and p.done < p.total:
            return
        last[0] = now
        width = 30
        fill = p.done * width // max(1, p.total)
        line = f"[{'#' * fill}{'.' * (width - fill)}] {p.created}/{p.total} ready, {p.failed} failed, {now - start:.0f}s"
        out.write(("\r" + line) if tty else (line + "\n"))
        if tty and p.done >= p.total:
            out.write("\n")
        out.flush()

    return show


class Client(AdminCalls):
    """A client of one dsec server.

    Args:
        url: the server, e.g. ``"http://127.0.0.1:7070"``; default ``$DSEC_URL``.
        api_key: default ``$DSEC_API_KEY``.
        timeout: seconds for calls that run no command (create, files, ...).
        retries: how many times a retryable failure is retried.
        max_idle_connections: keep-alive connections kept for reuse.
    """

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *, timeout: float = 60.0,
                 retries: int = 3, max_idle_connections: int = 64) -> None:
        self.url = (url or os.environ.get("DSEC_URL") or "http://127.0.0.1:7070").rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("DSEC_API_KEY", "")
        self.timeout = timeout
        self.retries = retries
        self._pool = Pool(self.url, max_idle=max_idle_connections)

    # -- plumbing -----------------------------------------------------------------------------

    def _send(self, req: _ops.Req) -> Response:
        headers = dict(req.headers)
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        timeout = req.timeout or self.timeout
        attempt = 0
        while True:
            try:
                resp = self._pool.request(req.method, req.target, headers, req.body, timeout)
                if resp.status < 300:
                    return resp
                err = error_from_response(resp.status, resp.read(), resp.reason)
                hdrs = resp.headers
            except ApiError as e:  # connection errors are ApiErrors too
                err, hdrs = e, {}
            if attempt >= self.retries or not should_retry(req, err, hdrs):
                raise err
            time.sleep(delay(attempt, hdrs))
            attempt += 1

    def _json(self, req: _ops.Req) -> Any:
        data = self._send(req).read()
        return json.loads(data) if data else None

    # -- sandboxes ----------------------------------------------------------------------------

    def health(self) -> Health:
        """``GET /healthz``."""
        return Health.from_json(self._json(_ops.jreq("GET", "/healthz")))

    def create(self, *, layers: _ops.Layers = None, base: Optional[str] = None,
               workspace: Optional[str] = None, toolkit: Optional[str] = None, backend: Optional[str] = None,
               snapshot: Optional[str] = None, resources: Optional[Mapping[str, Any]] = None,
               cpu: Optional[float] = None, memory_mb: Optional[int] = None, disk_mb: Optional[int] = None,
               pids: Optional[int] = None, network: Union[str, Mapping[str, Any], None] = None,
               phase: Optional[str] = None, phases: Optional[Mapping[str, Any]] = None, profile: Optional[str] = None,
               ttl_seconds: Optional[int] = None, idle_timeout_seconds: Optional[int] = None,
               labels: Optional[Mapping[str, str]] = None, env: Optional[Mapping[str, str]] = None,
               burst: bool = False, admission_timeout_seconds: Optional[int] = None,
               timeout: Optional[float] = None) -> "Sandbox":
        """Creates a sandbox and returns it running.

        Keyword args: ``layers`` (a base ref or ``{"base", "workspace",
        "toolkit"}``), or ``base``/``workspace``/``toolkit``; ``backend``
        (``container`` default, ``fncall`` takes a warm one, ``microvm``,
        ``fullvm``); ``snapshot``; ``resources`` or ``cpu``/``memory_mb``/
        ``disk_mb``/``pids``; ``network``; ``phase``/``phases``/``profile``;
        ``ttl_seconds``; ``idle_timeout_seconds``; ``labels``; ``env``;
        ``burst=True`` lets it run on a cloud burst node (the scheduler uses
        those only while the regular nodes are above its threshold);
        ``admission_timeout_seconds`` bounds the wait when every node with
        room is busy (default 60; -1 fails at once instead): the call waits
        with it. Memory and quotas never wait: they fail at once.
        ``with client.create(...) as sb:`` renews its lease in the background
        while the block runs and destroys it on exit.
        """
        body = _ops.spec(layers=layers, base=base, workspace=workspace, toolkit=toolkit, backend=backend, snapshot=snapshot,
                        resources=resources, cpu=cpu, memory_mb=memory_mb, disk_mb=disk_mb, pids=pids, network=network,
                        phase=phase, phases=phases, profile=profile, ttl_seconds=ttl_seconds,
                        idle_timeout_seconds=idle_timeout_seconds, labels=labels, env=env, burst=burst,
                        admission_timeout_seconds=admission_timeout_seconds)
        return Sandbox(self, SandboxInfo.from_json(self._json(_ops.create(body, timeout))))

    def create_batch(self, count: int, *, layers: _ops.Layers = None, base: Optional[str] = None,
                     workspace: Optional[str] = None, toolkit: Optional[str] = None, backend: Optional[str] = None,
                     snapshot: Optional[str] = None, resources: Optional[Mapping[str, Any]] = None,
                     cpu: Optional[float] = None, memory_mb: Optional[int] = None, disk_mb: Optional[int] = None,
                     pids: Optional[int] = None, network: Union[str, Mapping[str, Any], None] = None,
                     phase: Optional[str] = None, phases: Optional[Mapping[str, Any]] = None, profile: Optional[str] = None,
                     ttl_seconds: Optional[int] = None, idle_timeout_seconds: Optional[int] = None,
                     labels: Optional[Mapping[str, str]] = None, env: Optional[Mapping[str, str]] = None,
                     burst: bool = False, admission_timeout_seconds: Optional[int] = None,
                     progress: ProgressArg = None, timeout: Optional[float] = None) -> "BatchResult":
        """Creates ``count`` sandboxes (up to 32,768) from one spec in one call.

        Partial success is normal: see :attr:`BatchResult.sandboxes` and
        :attr:`BatchResult.errors`. ``progress=True`` draws a bar on stderr; a
        callable gets each :class:`BatchProgress`. ``timeout`` bounds the wait
        for each progress event (the server sends one every 0.25 s), not the
        whole batch. If this process dies mid-batch, the server destroys what
        the batch made.
        """
        cb = progress_bar() if progress is True else (progress or None)
        body = _ops.spec(layers=layers, base=base, workspace=workspace, toolkit=toolkit, backend=backend, snapshot=snapshot,
                        resources=resources, cpu=cpu, memory_mb=memory_mb, disk_mb=disk_mb, pids=pids, network=network,
                        phase=phase, phases=phases, profile=profile, ttl_seconds=ttl_seconds,
                        idle_timeout_seconds=idle_timeout_seconds, labels=labels, env=env, burst=burst,
                        admission_timeout_seconds=admission_timeout_seconds)
        resp = self._send(_ops.batch(count, body, None))
        items: List[Optional[BatchItem]] = [None] * count
        result: Optional[Dict[str, Any]] = None
        with resp:
            for line in resp.iter_lines(timeout=timeout or 120.0):
                ev = json.loads(line)
                if "progress" in ev and cb:
                    cb(BatchProgress(**{k: int(ev["progress"].get(k, 0)) for k in ("total", "placed", "created", "failed")}))
                elif "item" in ev:
                    it = BatchItem.from_json(ev["item"])
                    if 0 <= it.index < count:
                        items[it.index] = it
                elif "result" in ev:
                    result = ev["result"]
                elif "error" in ev:
                    e = ev["error"]
                    raise error_from_response(500, json.dumps({"error": e}).encode())
        if result is None:
            raise DsecError("the batch stream ended without a result")
        return BatchResult(self, result, [it or BatchItem(i, state="unknown") for i, it in enumerate(items)])

    def sandbox(self, sandbox_id: str) -> "Sandbox":
        """A handle on an existing sandbox, without asking the server."""
        return Sandbox(self, SandboxInfo(id=sandbox_id, backend="", state=""))

    def get(self, sandbox_id: str) -> "Sandbox":
        """Reads a sandbox (any state until its record is purged)."""
        return Sandbox(self, SandboxInfo.from_json(self._json(_ops.jreq("GET", _ops.sb_path(sandbox_id)))))

    def list(self, *, labels: Optional[Mapping[str, str]] = None, state: Union[str, Sequence[str], None] = None,
             all: bool = False, page_size: int = 1000) -> Iterator["Sandbox"]:
        """Iterates over the tenant's sandboxes, every page, in id order."""
        token = ""
        while True:
            q = _ops.list_query(labels, state, all, page_size, token)
            page = self._json(_ops.jreq("GET", "/v1/sandboxes", query=q))
            for d in page.get("sandboxes") or []:
                yield Sandbox(self, SandboxInfo.from_json(d))
            token = page.get("next_page_token", "")
            if not token:
                return

    def delete(self, sandbox_id: str) -> None:
        """Destroys a sandbox; idempotent."""
        self._send(_ops.jreq("DELETE", _ops.sb_path(sandbox_id))).read()

    # -- fncall -------------------------------------------------------------------------------

    def fncall(self, cmd: _ops.Cmd, *, layers: _ops.Layers = None, base: Optional[str] = None,
               workspace: Optional[str] = None, toolkit: Optional[str] = None,
               resources: Optional[Mapping[str, Any]] = None, env: Optional[Mapping[str, str]] = None,
               cwd: Optional[str] = None, stdin: Union[str, bytes, None] = None, timeout: Optional[float] = None,
               max_output_bytes: Optional[int] = None, check: bool = False) -> ExecResult:
        """Runs one short command in a clean, warm sandbox of the layer stack.

        ``timeout`` (seconds, default 60) bounds the whole call, the wait for a
        free sandbox included; a call that finds none in time raises
        :class:`DeadlineExceededError`.
        """
        body = _ops.fncall_body(cmd, layers, base, workspace, toolkit, resources, env=env, cwd=cwd, stdin=stdin,
                                timeout=timeout, max_output_bytes=max_output_bytes)
        res = ExecResult.from_json(self._json(_ops.fncall(body, timeout)))
        return res.check() if check else res

    def warm_pool(self, size: int, *, layers: _ops.Layers = None, base: Optional[str] = None,
                  workspace: Optional[str] = None, toolkit: Optional[str] = None,
                  resources: Optional[Mapping[str, Any]] = None) -> PoolInfo:
        """Makes the FnCall pool of a layer stack hold at least ``size`` sandboxes."""
        body: Dict[str, Any] = {"layers": _ops.layers_obj(layers, base, workspace, toolkit) or {"base": "base:minimal"},
                                "size": size}
        if resources:
            body["resources"] = dict(resources)
        return PoolInfo.from_json(self._json(_ops.jreq("POST", "/v1/fncall/pools", body, timeout=_ops.CREATE_TIMEOUT)))

    def pools(self) -> List[PoolInfo]:
        """The tenant's FnCall pools."""
        return [PoolInfo.from_json(d) for d in self._json(_ops.jreq("GET", "/v1/fncall/pools"))["pools"]]

    # -- trajectories -------------------------------------------------------------------------

    def trajectory(self, id: str) -> TrajectoryLog:
        """The trajectory log: ``id``, ``steps`` (without their output),
        ``checkpoint_every`` and ``checkpoints``."""
        return TrajectoryLog.from_json(self._json(_ops.jreq("GET", _ops.trajectory_path(id))))

    def delete_trajectory(self, id: str, *, from_step: int = 0) -> None:
        """Drops a trajectory's steps from ``from_step`` on (all of them by
        default), and with them the checkpoints taken after those steps."""
        q = [("from_step", str(int(from_step)))] if from_step else []
        self._json(_ops.Req("DELETE", _ops.trajectory_path(id), query=q, idempotent=True))

    def restore_trajectory(self, id: str, *, step: Optional[int] = None, ttl_seconds: Optional[int] = None,
                           timeout: Optional[float] = None) -> "Sandbox":
        """Recreates a trajectory's lost sandbox from its newest checkpoint
        (or the one after ``step``): a new sandbox of the same spec starts
        from the checkpoint's snapshot, and replaying the trajectory into it
        returns the steps up to the checkpoint from the log (``replayed``);
        later steps run. The checkpoint is in the returned sandbox's
        ``checkpoint`` attribute. Checkpoints are taken when a step's
        trajectory has ``checkpoint_every``."""
        d = self._json(_ops.restore(id, step, ttl_seconds, timeout))
        sb = Sandbox(self, SandboxInfo.from_json(d["sandbox"]))
        sb.checkpoint = d.get("checkpoint")
        return sb

    # -- layers, profiles (admin calls: _admin.AdminCalls) -----------------------------------

    def build_layer(self, dockerfile: str, name: str, *, context: Optional[str] = None, flatten: bool = False,
                    kind: Optional[str] = None, network: Optional[str] = None,
                    args: Optional[Mapping[str, str]] = None, on_event: Optional[Callable[[Dict[str, Any]], None]] = None,
                    timeout: Optional[float] = None) -> Dict[str, Any]:
        """Builds a layer ``name`` from a Dockerfile (the context is its
        directory unless ``context`` is given). ``on_event`` gets every event
        (steps, RUN output). Returns the result: ``layer``, ``config``,
        ``steps``, ``cached_steps``. A failed build raises the error of its
        code with ``line`` and ``output`` attributes."""
        resp = self._send(_ops.build(_ops.build_context(dockerfile, context), name, flatten, kind, network, args))
        with resp:
            for line in resp.iter_lines(timeout=timeout or 1800.0):
                res = _ops.build_event(json.loads(line), on_event)
                if res is not None:
                    return res
        raise DsecError("the build stream ended without a result")

    def layers(self) -> List[Layer]:
        """The tenant's layers and the public ones."""
        return [Layer.from_json(d) for d in self._json(_ops.jreq("GET", "/v1/layers"))["layers"]]

    def layer(self, ref: str) -> Layer:
        """One layer by ``name:tag`` or ``sha256:...``."""
        return Layer.from_json(self._json(_ops.jreq("GET", "/v1/layers/" + ref)))

    def upload_layer(self, name: str, data: Union[bytes, str, Any], *, kind: str = "base", public: bool = False,
                     timeout: float = 600.0) -> Layer:
        """Uploads a layer: a tar stream (plain or gzip) or an EROFS image, as
        bytes, a path to such a file, or a binary file object."""
        if isinstance(data, str):
            with open(data, "rb") as f:
                data = f.read()
        elif not isinstance(data, (bytes, bytearray)):
            data = data.read()
        q = [("kind", kind), ("name", name)] + ([("public", "1")] if public else [])
        req = _ops.Req("POST", "/v1/layers", query=q, body=bytes(data), timeout=timeout,
                       headers={"Content-Type": "application/octet-stream"})
        return Layer.from_json(self._json(req))

    def profiles(self) -> Dict[str, Profile]:
        """The policy profiles ``create(profile=...)`` accepts, by name: the
        built-in ones (``swe``) and those the server was started with."""
        d = self._json(_ops.jreq("GET", "/v1/profiles"))["profiles"] or {}
        return {name: Profile.from_json(name, p) for name, p in d.items()}

    def close(self) -> None:
        """Closes the pooled connections."""
        self._pool.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Sandbox:
    """A handle on one sandbox. ``info`` is what the server said last."""

    def __init__(self, client: Client, info: SandboxInfo) -> None:
        self.client = client
        self.info = info
        #: the checkpoint it was restored from (restore_trajectory), else None
        self.checkpoint: Optional[Dict[str, Any]] = None
        #: the copy's trajectory id when it came from a fork with a trajectory
        self.trajectory: Optional[str] = None

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def state(self) -> str:
        return self.info.state

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, state={self.info.state!r}, node={self.info.node!r})"

    def refresh(self) -> "Sandbox":
        """Reads the sandbox again."""
        self.info = SandboxInfo.from_json(self.client._json(_ops.jreq("GET", _ops.sb_path(self.id))))
        return self

    # -- exec -----------------------------------------------------------------------------------

    def exec(self, cmd: _ops.Cmd, *, timeout: Optional[float] = None, env: Optional[Mapping[str, str]] = None,
             cwd: Optional[str] = None, stdin: Union[str, bytes, None] = None, max_output_bytes: Optional[int] = None,
             trajectory: Any = None, check: bool = False, tty: Optional[Tuple[int, int]] = None) -> ExecResult:
        """Runs a command and waits for it.

        ``cmd`` is a shell string (``/bin/sh -c``) or an argv list; ``timeout``
        in seconds kills it (server default 600); ``trajectory=(id, step)``
        keys it into the trajectory log (``(id, step, k)`` also asks for a
        checkpoint every k steps). ``check=True`` raises
        :class:`libdsec.ExecError` unless it exits 0. ``tty=(rows, cols)``
        runs it on a pseudo-terminal: its output is one stream, in stdout.
        """
        body = _ops.exec_body(cmd, env=env, cwd=cwd, stdin=stdin, timeout=timeout,
                              max_output_bytes=max_output_bytes, trajectory=trajectory, tty=tty)
        res = ExecResult.from_json(self.client._json(_ops.exec_(self.id, body, timeout, False)))
        return res.check() if check else res

    def exec_stream(self, cmd: _ops.Cmd, *, timeout: Optional[float] = None, env: Optional[Mapping[str, str]] = None,
                    cwd: Optional[str] = None, stdin: Union[str, bytes, None] = None,
                    max_output_bytes: Optional[int] = None, trajectory: Any = None) -> "ExecStream":
        """Runs a command, yielding its output as it comes.

        Iterate the returned :class:`ExecStream` for :class:`OutputChunk`
        values; its ``result`` is set at the end. Closing it early kills the
        command.
        """
        body = _ops.exec_body(cmd, env=env, cwd=cwd, stdin=stdin, timeout=timeout,
                              max_output_bytes=max_output_bytes, trajectory=trajectory)
        resp = self.client._send(_ops.exec_(self.id, body, timeout, True))
        return ExecStream(resp, _ops.http_timeout(timeout))

    def spawn(self, cmd: _ops.Cmd, *, timeout: Optional[float] = None, env: Optional[Mapping[str, str]] = None,
              cwd: Optional[str] = None, stdin: Union[str, bytes, None] = None,
              max_output_bytes: Optional[int] = None) -> "Process":
        """Starts a background command and returns its :class:`Process` at once."""
        body = _ops.exec_body(cmd, env=env, cwd=cwd, stdin=stdin, timeout=timeout,
                              max_output_bytes=max_output_bytes, background=True)
        res = ExecResult.from_json(self.client._json(_ops.exec_(self.id, body, 30.0, False)))
        assert res.process is not None, "a background exec answers with a process"
        return Process(self, res.process)

    def terminal(self, cmd: Union[str, Sequence[str], None] = None, *, rows: int = 24, cols: int = 80,
                 cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> Terminal:
        """Opens an interactive terminal running ``cmd`` (default: the
        sandbox's shell) on a pseudo-terminal of ``rows`` x ``cols``."""
        headers = {"Authorization": "Bearer " + self.client.api_key} if self.client.api_key else {}
        ws = WebSocket.connect(self.client.url, terminal_target(self.id, cmd, cwd, env, rows, cols), headers,
                               self.client.timeout)
        return Terminal(ws)

    def port_url(self, port: int, *, path: str = "/", ttl_seconds: Optional[int] = None) -> str:
        """A signed URL of ``port`` in the sandbox that works without a key
        (in a browser) until it expires (default 1 h, at most 24 h)."""
        body: Dict[str, Any] = {"path": path}
        if ttl_seconds:
            body["ttl_seconds"] = int(ttl_seconds)
        return self.client._json(_ops.jreq("POST", _ops.sb_path(self.id, "ports", str(int(port)), "url"), body))["url"]

    def terminal_url(self) -> str:
        """A signed ``ws://`` URL of the sandbox's terminal that opens
        without a key for one minute (for a browser, which cannot set a
        WebSocket's headers); add ``cmd``/``rows``/``cols`` to its query."""
        return self.client._json(_ops.jreq("POST", _ops.sb_path(self.id, "terminal", "url")))["url"]

    def vnc_url(self) -> str:
        """A signed ``ws://`` URL of the sandbox's VNC WebSocket that opens
        without a key for one minute."""
        return self.client._json(_ops.jreq("POST", _ops.sb_path(self.id, "vnc", "url")))["url"]

    def port_path(self, port: int, path: str = "/") -> str:
        """The API path that proxies HTTP and WebSockets to ``port`` (use
        with the client's key)."""
        return _ops.sb_path(self.id, "ports", str(int(port))) + ("/" + path.lstrip("/"))

    def processes(self) -> List["Process"]:
        """Background processes, running and exited, in start order."""
        d = self.client._json(_ops.jreq("GET", _ops.proc_path(self.id)))
        return [Process(self, ProcessInfo.from_json(p)) for p in d["processes"]]

    def process(self, pid: str) -> "Process":
        """A background process by id (``p-1``...)."""
        return Process(self, ProcessInfo(id=pid)).refresh()

    # -- screen and input (fullvm sandboxes) -----------------------------------------------------

    def screenshot(self) -> bytes:
        """The screen as PNG bytes."""
        return self.client._send(_ops.screen(self.id, self.client.timeout)).read()

    def input(self, actions: List[Dict[str, Any]]) -> Dict[str, Any]:
        """Performs input actions in order ({"type": "click", "x": 1, "y": 2}, ...); answers when done."""
        return self.client._json(_ops.input_req(self.id, actions))

    def click(self, x: int, y: int, button: str = "left") -> Dict[str, Any]:
        return self.input([_ops.act_click(x, y, button)])

    def double_click(self, x: int, y: int, button: str = "left") -> Dict[str, Any]:
        return self.input([_ops.act_click(x, y, button, 2)])

    def move(self, x: int, y: int) -> Dict[str, Any]:
        return self.input([_ops.act_move(x, y)])

    def drag(self, x0: int, y0: int, x1: int, y1: int) -> Dict[str, Any]:
        return self.input([_ops.act_drag(x0, y0, x1, y1)])

    def scroll(self, x: int, y: int, dx: int = 0, dy: int = 0) -> Dict[str, Any]:
        return self.input([_ops.act_scroll(x, y, dx, dy)])

    def type(self, text: str) -> Dict[str, Any]:
        """Types text (printable ASCII, newline, tab) on a US keyboard."""
        return self.input([_ops.act_type(text)])

    def key(self, keys: str) -> Dict[str, Any]:
        """Presses a chord such as "ctrl+c" or "Return"."""
        return self.input([_ops.act_key(keys)])

    # -- files ----------------------------------------------------------------------------------

    def read_file(self, path: str) -> bytes:
        """A file's bytes."""
        return self.client._send(_ops.files("GET", self.id, path, self.client.timeout)).read()

    def read_text(self, path: str) -> str:
        """A file as UTF-8 text."""
        return self.read_file(path).decode("utf-8")

    def write_file(self, path: str, data: Union[bytes, str], *, mode: Optional[int] = None) -> None:
        """Writes a file atomically, creating parent directories (mode 0644 unless given)."""
        req = _ops.files("PUT", self.id, path, self.client.timeout, mode=None if mode is None else format(mode, "o"))
        req.body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        req.headers["Content-Type"] = "application/octet-stream"
        self.client._send(req).read()

    def list_dir(self, path: str) -> List[FileInfo]:
        """A directory's entries, sorted by name."""
        d = self.client._json(_ops.files("GET", self.id, path, self.client.timeout, list="1"))
        return [FileInfo.from_json(e) for e in d["entries"]]

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file or an empty directory; a whole tree with ``recursive``."""
        self.client._send(_ops.files("DELETE", self.id, path, self.client.timeout,
                                     recursive="1" if recursive else None)).read()

    # -- lifecycle ------------------------------------------------------------------------------

    def _lifecycle(self, op: str) -> "Sandbox":
        d = self.client._json(_ops.lifecycle(self.id, op, _ops.CREATE_TIMEOUT))
        self.info = SandboxInfo.from_json(d)
        return self

    def reset(self) -> "Sandbox":
        """Back to the clean state of its layers, in place: every process killed."""
        return self._lifecycle("reset")

    def pause(self, memory: Optional[str] = None) -> "Sandbox":
        """Freezes every process. ``memory="disk"`` hibernates a microVM:
        its memory goes to its node's disk and its VMM ends (no RAM held);
        :meth:`resume` restores it with its processes."""
        if memory:
            self.info = SandboxInfo.from_json(self.client._json(_ops.pause(self.id, memory, _ops.CREATE_TIMEOUT)))
            return self
        return self._lifecycle("pause")

    def resume(self) -> "Sandbox":
        """Thaws a paused sandbox."""
        return self._lifecycle("resume")

    def fork(self, count: int, *, labels: Optional[Mapping[str, str]] = None, trajectory: Optional[str] = None,
             trajectory_ids: Optional[Sequence[str]] = None, ttl_seconds: Optional[int] = None,
             timeout: Optional[float] = None) -> List["Sandbox"]:
        """Makes ``count`` copies (1 to 256) of this sandbox's state now and
        returns them; this sandbox goes on (it is frozen only while its
        changes are copied). Each copy holds the filesystem as it was at the
        call; a container's processes are not carried, a microVM's memory and
        processes are (each copy goes on from the fork, under its own host
        name and machine id). ``trajectory`` forks
        that trajectory log along: each copy's ``trajectory`` attribute is
        its own trajectory id (``trajectory_ids`` names them), where the
        parent's steps replay. All or nothing."""
        d = self.client._json(_ops.fork(self.id, count, labels, trajectory, trajectory_ids, ttl_seconds, timeout))
        out = [Sandbox(self.client, SandboxInfo.from_json(x)) for x in d["sandboxes"]]
        for sb, tr in zip(out, d.get("trajectories") or []):
            sb.trajectory = tr["id"]
        return out

    def snapshot(self) -> str:
        """pack_diff: saves the sandbox's changes as a layer; returns a ref to
        create from (``client.create(snapshot=ref)``)."""
        d = self.client._json(_ops.jreq("POST", _ops.sb_path(self.id, "snapshot"), None, timeout=600.0))
        return d["ref"]

    def set_phase(self, phase: str) -> "Sandbox":
        """Switches the sandbox's policy phase (e.g. ``setup`` -> ``agent`` -> ``eval``)."""
        d = self.client._json(_ops.jreq("PUT", _ops.sb_path(self.id, "phase"), {"phase": phase}))
        if isinstance(d, dict) and "id" in d:
            self.info = SandboxInfo.from_json(d)
        else:
            self.info.phase = phase
        return self

    def renew(self, ttl_seconds: Optional[int] = None) -> "Sandbox":
        """Extends the lease: the sandbox now expires ``ttl_seconds`` from now
        (its own TTL when not given)."""
        self.info = SandboxInfo.from_json(self.client._json(_ops.renew(self.id, ttl_seconds)))
        return self

    def keepalive(self, ttl_seconds: Optional[int] = None) -> "Keepalive":
        """Renews the lease from a background thread, every third of the TTL,
        until :meth:`Keepalive.stop` (or this process ends, after which the
        lease runs out and the server reaps the sandbox)."""
        return Keepalive(self, ttl_seconds)

    def close(self) -> None:
        """Destroys the sandbox; idempotent."""
        ka = getattr(self, "_keepalive", None)
        if ka is not None:
            ka.stop()
        self.client.delete(self.id)
        self.info.state = "deleted"

    delete = close

    def __enter__(self) -> "Sandbox":
        self._keepalive = self.keepalive()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Keepalive:
    """A background thread renewing a sandbox's lease; see :meth:`Sandbox.keepalive`.

    ``error`` holds the last renewal error (a sandbox already gone ends it)."""

    def __init__(self, sb: "Sandbox", ttl_seconds: Optional[int]) -> None:
        self.error: Optional[BaseException] = None
        self._sb, self._ttl = sb, ttl_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dsec-keepalive-" + sb.id, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        interval = _ops.keepalive_interval(self._sb.info.raw, self._ttl)
        while not self._stop.wait(interval):
            try:
                self._sb.renew(self._ttl)
                self.error = None
            except ApiError as e:
                self.error = e
                if e.code == "not_found":
                    return
            except DsecError as e:
                self.error = e

    def stop(self) -> None:
        """Stops renewing (the lease then runs its course)."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)


class ExecStream:
    """The output of a streamed exec, as :class:`OutputChunk` values.

    ``result`` holds the :class:`ExecResult` once the stream ended. Use it as a
    context manager, or call :meth:`close`, to stop early (which kills the
    command)."""

    def __init__(self, resp: Response, read_timeout: float) -> None:
        self._resp = resp
        self._lines = resp.iter_lines(timeout=read_timeout)
        self.result: Optional[ExecResult] = None

    def __iter__(self) -> Iterator[OutputChunk]:
        return self

    def __next__(self) -> OutputChunk:
        if self.result is not None:
            raise StopIteration
        ctype = self._resp.headers.get("content-type", "")
        if ctype.startswith("application/json"):
            self.result = ExecResult.from_json(json.loads(self._resp.read()))
            raise StopIteration
        for line in self._lines:
            ev = parse_exec_event(json.loads(line))
            if isinstance(ev, OutputChunk):
                return ev
            if isinstance(ev, ExecResult):
                self.result = ev
                for _ in self._lines:  # read to the end so the connection is reused
                    pass
                raise StopIteration
            if isinstance(ev, ApiError):
                self.close()
                raise ev
        raise DsecError("exec stream ended without a result")

    def wait(self) -> ExecResult:
        """Reads the rest of the stream (discarding output) and returns the result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def close(self) -> None:
        self._resp.close()

    def __enter__(self) -> "ExecStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Process:
    """A background command started with :meth:`Sandbox.spawn`."""

    def __init__(self, sandbox: Sandbox, info: ProcessInfo) -> None:
        self.sandbox = sandbox
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def running(self) -> bool:
        return self.info.running

    @property
    def result(self) -> Optional[ExecResult]:
        return self.info.result

    def __repr__(self) -> str:
        return f"Process({self.id!r}, running={self.info.running})"

    def _path(self, rest: str = "") -> str:
        return _ops.proc_path(self.sandbox.id, self.id, rest)

    def refresh(self) -> "Process":
        self.info = ProcessInfo.from_json(self.sandbox.client._json(_ops.jreq("GET", self._path())))
        return self

    def wait(self, timeout: Optional[float] = None) -> "Process":
        """Waits until it exits or ``timeout`` seconds pass (check ``running``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 300.0 if deadline is None else max(0.0, deadline - time.monotonic())
            step = min(left, 300.0)
            q = [("timeout_ms", str(int(step * 1000)))]
            req = _ops.jreq("GET", self._path("wait"), query=q, timeout=step + _ops.EXEC_MARGIN)
            self.info = ProcessInfo.from_json(self.sandbox.client._json(req))
            if not self.info.running or (deadline is not None and time.monotonic() >= deadline):
                return self

    def output(self, stream: str = "stdout", offset: int = 0) -> OutputPage:
        """The bytes of ``stream`` kept from ``offset`` on."""
        req = _ops.jreq("GET", self._path("output"), query=[("stream", stream), ("offset", str(offset))])
        resp = self.sandbox.client._send(req)
        data = resp.read()
        h = resp.headers
        return OutputPage(data, int(h.get("x-dsec-offset", offset)), int(h.get("x-dsec-next-offset", offset + len(data))),
                          int(h.get("x-dsec-dropped", 0)))

    def follow(self, stream: str = "stdout", offset: int = 0, *, timeout: float = 3600.0) -> Iterator[bytes]:
        """Yields output as it is written, until the process exits."""
        req = _ops.jreq("GET", self._path("output"),
                        query=[("stream", stream), ("offset", str(offset)), ("follow", "1")], timeout=timeout)
        resp = self.sandbox.client._send(req)
        with resp:
            while True:
                try:
                    chunk = resp._resp.read1(65536)  # type: ignore[attr-defined]
                except OSError as e:
                    raise DsecError(f"following output: {e}") from e
                if not chunk:
                    break
                yield chunk
            resp._finish()

    def logs(self, *, follow: bool = False, stream: Optional[str] = None, offset: int = 0, stderr_offset: int = 0,
             timeout: float = 3600.0) -> Iterator[OutputChunk]:
        """Yields its stdout and stderr (or ``stream`` alone) as
        :class:`OutputChunk` (with ``.offset``, to resume from) from the
        offsets on; with ``follow`` until it exits, then ``info`` holds its
        result. Any client of the tenant may read them, while it runs."""
        req = _ops.jreq("GET", self._path("output"), query=_ops.logs_query(stream, offset, stderr_offset, follow),
                        timeout=timeout)
        req.headers["Accept"] = "application/x-ndjson"
        resp = self.sandbox.client._send(req)
        with resp:
            for line in resp.iter_lines(timeout):
                ev = parse_output_event(json.loads(line))
                if isinstance(ev, OutputChunk):
                    yield ev
                elif isinstance(ev, ExecResult):
                    self.refresh()

    def signal(self, sig: str = "TERM") -> "Process":
        """Sends a signal (TERM, KILL, INT, HUP, QUIT, USR1, USR2) to its process group."""
        req = _ops.jreq("POST", self._path("signal"), None, query=[("signal", sig)])
        self.info = ProcessInfo.from_json(self.sandbox.client._json(req))
        return self

    def kill(self) -> "Process":
        return self.signal("KILL")

    def forget(self) -> None:
        """Drops an exited process's record."""
        self.sandbox.client._send(_ops.jreq("DELETE", self._path())).read()


class BatchResult:
    """What a batch create made. ``sandboxes`` are the created ones (in index
    order); ``errors`` the items that failed. As a context manager it
    destroys every created sandbox on exit."""

    def __init__(self, client: Client, result: Dict[str, Any], items: List[BatchItem]) -> None:
        self.client = client
        self.batch: str = result.get("batch", "")
        self.requested = int(result.get("requested", 0))
        self.created = int(result.get("created", 0))
        self.failed = int(result.get("failed", 0))
        self.duration_ms = int(result.get("duration_ms", 0))
        self.items = items

    @property
    def sandboxes(self) -> List[Sandbox]:
        return [self.client.sandbox(it.id) for it in self.items if it.error is None and it.id]

    @property
    def errors(self) -> List[BatchItem]:
        return [it for it in self.items if it.error is not None]

    def __len__(self) -> int:
        return self.created

    def __repr__(self) -> str:
        return f"BatchResult({self.batch!r}, created={self.created}, failed={self.failed})"

    def close_all(self, parallel: int = 32) -> None:
        """Destroys every sandbox the batch created."""
        with ThreadPoolExecutor(max_workers=parallel) as ex:
            list(ex.map(lambda sb: sb.close(), self.sandboxes))

    def __enter__(self) -> "BatchResult":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_all()

