"""The asyncio client: :class:`AsyncClient` and its handles, the twins of
the blocking ones in :mod:`libdsec.client`, on one event loop."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _ops
from ._terminal import AsyncTerminal, terminal_target
from ._websocket import AsyncWebSocket
from ._admin import AsyncAdminCalls
from ._asynchttp import AsyncPool, AsyncResponse
from ._retry import delay, should_retry
from .client import ProgressArg, progress_bar
from .errors import ApiError, DsecError, error_from_response
from .models import (BatchItem, BatchProgress, ExecResult, FileInfo, Layer, OutputChunk, OutputPage, Pool as PoolInfo,
                     Health, ProcessInfo, Profile, SandboxInfo, TrajectoryLog, parse_exec_event, parse_output_event)

__all__ = ["AsyncClient", "AsyncSandbox", "AsyncProcess", "AsyncExecStream", "AsyncBatchResult"]


class AsyncClient(AsyncAdminCalls):
    """A client of one dsec server for asyncio; see :class:`libdsec.Client`
    for the arguments. Use it from one event loop, and ``await close()`` (or
    ``async with``) when done."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *, timeout: float = 60.0,
                 retries: int = 3, max_idle_connections: int = 64) -> None:
        self.url = (url or os.environ.get("DSEC_URL") or "http://127.0.0.1:7070").rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("DSEC_API_KEY", "")
        self.timeout = timeout
        self.retries = retries
        self._pool = AsyncPool(self.url, max_idle=max_idle_connections)

    async def _send(self, req: _ops.Req) -> AsyncResponse:
        headers = dict(req.headers)
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        timeout = req.timeout or self.timeout
        attempt = 0
        while True:
            try:
                resp = await self._pool.request(req.method, req.target, headers, req.body, timeout)
                if resp.status < 300:
                    return resp
                err = error_from_response(resp.status, await resp.read(timeout), resp.reason)
                hdrs = resp.headers
            except ApiError as e:
                err, hdrs = e, {}
            if attempt >= self.retries or not should_retry(req, err, hdrs):
                raise err
            await asyncio.sleep(delay(attempt, hdrs))
            attempt += 1

    async def _json(self, req: _ops.Req) -> Any:
        resp = await self._send(req)
        data = await resp.read(req.timeout or self.timeout)
        return json.loads(data) if data else None

    async def health(self) -> Health:
        """``GET /healthz``."""
        return Health.from_json(await self._json(_ops.jreq("GET", "/healthz")))

    async def create(self, *, layers: _ops.Layers = None, base: Optional[str] = None,
                     workspace: Optional[str] = None, toolkit: Optional[str] = None, backend: Optional[str] = None,
                     snapshot: Optional[str] = None, resources: Optional[Mapping[str, Any]] = None,
                     cpu: Optional[float] = None, memory_mb: Optional[int] = None, disk_mb: Optional[int] = None,
                     pids: Optional[int] = None, network: Union[str, Mapping[str, Any], None] = None,
                     phase: Optional[str] = None, phases: Optional[Mapping[str, Any]] = None, profile: Optional[str] = None,
                     ttl_seconds: Optional[int] = None, idle_timeout_seconds: Optional[int] = None,
                     labels: Optional[Mapping[str, str]] = None, env: Optional[Mapping[str, str]] = None,
                     burst: bool = False, admission_timeout_seconds: Optional[int] = None,
                     timeout: Optional[float] = None) -> "AsyncSandbox":
        """Creates a sandbox (``burst=True`` may put it on a cloud burst
        node); like :meth:`libdsec.Client.create`, it waits while the nodes
        with room are busy, up to ``admission_timeout_seconds`` (60)."""
        body = _ops.spec(layers=layers, base=base, workspace=workspace, toolkit=toolkit, backend=backend, snapshot=snapshot,
                        resources=resources, cpu=cpu, memory_mb=memory_mb, disk_mb=disk_mb, pids=pids, network=network,
                        phase=phase, phases=phases, profile=profile, ttl_seconds=ttl_seconds,
                        idle_timeout_seconds=idle_timeout_seconds, labels=labels, env=env, burst=burst,
                        admission_timeout_seconds=admission_timeout_seconds)
        d = await self._json(_ops.create(body, timeout))
        return AsyncSandbox(self, SandboxInfo.from_json(d))

    async def trajectory(self, id: str) -> TrajectoryLog:
        """The trajectory log; see :meth:`libdsec.Client.trajectory`."""
        return TrajectoryLog.from_json(await self._json(_ops.jreq("GET", _ops.trajectory_path(id))))

    async def delete_trajectory(self, id: str, *, from_step: int = 0) -> None:
        """Drops a trajectory's steps; see :meth:`libdsec.Client.delete_trajectory`."""
        q = [("from_step", str(int(from_step)))] if from_step else []
        await self._json(_ops.Req("DELETE", _ops.trajectory_path(id), query=q, idempotent=True))

    async def restore_trajectory(self, id: str, *, step: Optional[int] = None, ttl_seconds: Optional[int] = None,
                                 timeout: Optional[float] = None) -> "AsyncSandbox":
        """Recreates a trajectory's lost sandbox from a checkpoint; see
        :meth:`libdsec.Client.restore_trajectory`."""
        d = await self._json(_ops.restore(id, step, ttl_seconds, timeout))
        sb = AsyncSandbox(self, SandboxInfo.from_json(d["sandbox"]))
        sb.checkpoint = d.get("checkpoint")
        return sb

    async def build_layer(self, dockerfile: str, name: str, *, context: Optional[str] = None, flatten: bool = False,
                          kind: Optional[str] = None, network: Optional[str] = None,
                          args: Optional[Mapping[str, str]] = None, on_event: Any = None,
                          timeout: Optional[float] = None) -> Dict[str, Any]:
        """Builds a layer from a Dockerfile; see :meth:`libdsec.Client.build_layer`."""
        resp = await self._send(_ops.build(_ops.build_context(dockerfile, context), name, flatten, kind, network, args))
        try:
            async for line in resp.iter_lines(timeout or 1800.0):
                res = _ops.build_event(json.loads(line), on_event)
                if res is not None:
                    return res
        finally:
            resp.close()
        raise DsecError("the build stream ended without a result")

    async def create_batch(self, count: int, *, layers: _ops.Layers = None, base: Optional[str] = None,
                           workspace: Optional[str] = None, toolkit: Optional[str] = None, backend: Optional[str] = None,
                           snapshot: Optional[str] = None, resources: Optional[Mapping[str, Any]] = None,
                           cpu: Optional[float] = None, memory_mb: Optional[int] = None, disk_mb: Optional[int] = None,
                           pids: Optional[int] = None, network: Union[str, Mapping[str, Any], None] = None,
                           phase: Optional[str] = None, phases: Optional[Mapping[str, Any]] = None, profile: Optional[str] = None,
                           ttl_seconds: Optional[int] = None, idle_timeout_seconds: Optional[int] = None,
                           labels: Optional[Mapping[str, str]] = None, env: Optional[Mapping[str, str]] = None,
                           burst: bool = False, admission_timeout_seconds: Optional[int] = None,
                           progress: ProgressArg = None, timeout: Optional[float] = None) -> "AsyncBatchResult":
        """Creates ``count`` sandboxes in one call; see :meth:`libdsec.Client.create_batch`."""
        cb = progress_bar() if progress is True else (progress or None)
        body = _ops.spec(layers=layers, base=base, workspace=workspace, toolkit=toolkit, backend=backend, snapshot=snapshot,
                        resources=resources, cpu=cpu, memory_mb=memory_mb, disk_mb=disk_mb, pids=pids, network=network,
                        phase=phase, phases=phases, profile=profile, ttl_seconds=ttl_seconds,
                        idle_timeout_seconds=idle_timeout_seconds, labels=labels, env=env, burst=burst,
                        admission_timeout_seconds=admission_timeout_seconds)
        resp = await self._send(_ops.batch(count, body, None))
        items: List[Optional[BatchItem]] = [None] * count
        result: Optional[Dict[str, Any]] = None
        try:
            async for line in resp.iter_lines(timeout or 120.0):
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
                    raise error_from_response(500, json.dumps({"error": ev["error"]}).encode())
        finally:
            resp.close()
        if result is None:
            raise DsecError("the batch stream ended without a result")
        return AsyncBatchResult(self, result, [it or BatchItem(i, state="unknown") for i, it in enumerate(items)])

    def sandbox(self, sandbox_id: str) -> "AsyncSandbox":
        return AsyncSandbox(self, SandboxInfo(id=sandbox_id, backend="", state=""))

    async def get(self, sandbox_id: str) -> "AsyncSandbox":
        d = await self._json(_ops.jreq("GET", _ops.sb_path(sandbox_id)))
        return AsyncSandbox(self, SandboxInfo.from_json(d))

    async def list(self, *, labels: Optional[Mapping[str, str]] = None,
                   state: Union[str, Sequence[str], None] = None, all: bool = False,
                   page_size: int = 1000) -> AsyncIterator["AsyncSandbox"]:
        """Iterates over the tenant's sandboxes matching the filters, every
        page, in id order (``async for sb in client.list(...)``)."""
        token = ""
        while True:
            page = await self._json(_ops.jreq("GET", "/v1/sandboxes",
                                              query=_ops.list_query(labels, state, all, page_size, token)))
            for d in page.get("sandboxes") or []:
                yield AsyncSandbox(self, SandboxInfo.from_json(d))
            token = page.get("next_page_token", "")
            if not token:
                return

    async def delete(self, sandbox_id: str) -> None:
        await (await self._send(_ops.jreq("DELETE", _ops.sb_path(sandbox_id)))).read(self.timeout)

    async def fncall(self, cmd: _ops.Cmd, *, layers: _ops.Layers = None, base: Optional[str] = None,
                     workspace: Optional[str] = None, toolkit: Optional[str] = None,
                     resources: Optional[Mapping[str, Any]] = None, env: Optional[Mapping[str, str]] = None,
                     cwd: Optional[str] = None, stdin: Union[str, bytes, None] = None,
                     timeout: Optional[float] = None, max_output_bytes: Optional[int] = None,
                     check: bool = False) -> ExecResult:
        """One short call on a warm pool; see :meth:`libdsec.Client.fncall`."""
        body = _ops.fncall_body(cmd, layers, base, workspace, toolkit, resources, env=env, cwd=cwd, stdin=stdin,
                                timeout=timeout, max_output_bytes=max_output_bytes)
        res = ExecResult.from_json(await self._json(_ops.fncall(body, timeout)))
        return res.check() if check else res

    async def warm_pool(self, size: int, *, layers: _ops.Layers = None, base: Optional[str] = None,
                        workspace: Optional[str] = None, toolkit: Optional[str] = None,
                        resources: Optional[Mapping[str, Any]] = None) -> PoolInfo:
        """Makes the FnCall pool of a layer stack hold at least ``size`` sandboxes."""
        body: Dict[str, Any] = {"layers": _ops.layers_obj(layers, base, workspace, toolkit) or {"base": "base:minimal"},
                                "size": size}
        if resources:
            body["resources"] = dict(resources)
        return PoolInfo.from_json(await self._json(_ops.jreq("POST", "/v1/fncall/pools", body,
                                                             timeout=_ops.CREATE_TIMEOUT)))

    async def pools(self) -> List[PoolInfo]:
        return [PoolInfo.from_json(d) for d in (await self._json(_ops.jreq("GET", "/v1/fncall/pools")))["pools"]]

    async def layers(self) -> List[Layer]:
        return [Layer.from_json(d) for d in (await self._json(_ops.jreq("GET", "/v1/layers")))["layers"]]

    async def layer(self, ref: str) -> Layer:
        return Layer.from_json(await self._json(_ops.jreq("GET", "/v1/layers/" + ref)))

    async def upload_layer(self, name: str, data: bytes, *, kind: str = "base", public: bool = False,
                           timeout: float = 600.0) -> Layer:
        q = [("kind", kind), ("name", name)] + ([("public", "1")] if public else [])
        req = _ops.Req("POST", "/v1/layers", query=q, body=bytes(data), timeout=timeout,
                       headers={"Content-Type": "application/octet-stream"})
        return Layer.from_json(await self._json(req))

    async def profiles(self) -> Dict[str, Profile]:
        """The policy profiles by name; see :meth:`libdsec.Client.profiles`."""
        d = (await self._json(_ops.jreq("GET", "/v1/profiles")))["profiles"] or {}
        return {name: Profile.from_json(name, p) for name, p in d.items()}

    async def close(self) -> None:
        await self._pool.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncSandbox:
    """A handle on one sandbox, for asyncio; see :class:`libdsec.Sandbox`."""

    def __init__(self, client: AsyncClient, info: SandboxInfo) -> None:
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
        return f"AsyncSandbox({self.id!r}, state={self.info.state!r})"

    async def refresh(self) -> "AsyncSandbox":
        self.info = SandboxInfo.from_json(await self.client._json(_ops.jreq("GET", _ops.sb_path(self.id))))
        return self

    async def exec(self, cmd: _ops.Cmd, *, timeout: Optional[float] = None,
                   env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                   stdin: Union[str, bytes, None] = None, max_output_bytes: Optional[int] = None,
                   trajectory: Any = None, check: bool = False, tty: Optional[Tuple[int, int]] = None) -> ExecResult:
        body = _ops.exec_body(cmd, env=env, cwd=cwd, stdin=stdin, timeout=timeout,
                              max_output_bytes=max_output_bytes, trajectory=trajectory, tty=tty)
        res = ExecResult.from_json(await self.client._json(_ops.exec_(self.id, body, timeout, False)))
        return res.check() if check else res

    async def exec_stream(self, cmd: _ops.Cmd, *, timeout: Optional[float] = None,
                          env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                          stdin: Union[str, bytes, None] = None, max_output_bytes: Optional[int] = None,
                          trajectory: Any = None) -> "AsyncExecStream":
        """Runs a command; ``async for chunk in stream`` yields its output."""
        body = _ops.exec_body(cmd, env=env, cwd=cwd, stdin=stdin, timeout=timeout,
                              max_output_bytes=max_output_bytes, trajectory=trajectory)
        resp = await self.client._send(_ops.exec_(self.id, body, timeout, True))
        return AsyncExecStream(resp, _ops.http_timeout(timeout))

    async def spawn(self, cmd: _ops.Cmd, *, timeout: Optional[float] = None,
                    env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                    stdin: Union[str, bytes, None] = None, max_output_bytes: Optional[int] = None) -> "AsyncProcess":
        body = _ops.exec_body(cmd, env=env, cwd=cwd, stdin=stdin, timeout=timeout,
                              max_output_bytes=max_output_bytes, background=True)
        res = ExecResult.from_json(await self.client._json(_ops.exec_(self.id, body, 30.0, False)))
        assert res.process is not None
        return AsyncProcess(self, res.process)

    async def terminal(self, cmd: Union[str, Sequence[str], None] = None, *, rows: int = 24, cols: int = 80,
                       cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> AsyncTerminal:
        """Opens an interactive terminal; see :meth:`libdsec.Sandbox.terminal`."""
        headers = {"Authorization": "Bearer " + self.client.api_key} if self.client.api_key else {}
        ws = await AsyncWebSocket.connect(self.client.url, terminal_target(self.id, cmd, cwd, env, rows, cols),
                                          headers, self.client.timeout)
        return AsyncTerminal(ws)

    async def port_url(self, port: int, *, path: str = "/", ttl_seconds: Optional[int] = None) -> str:
        """See :meth:`libdsec.Sandbox.port_url`."""
        body: Dict[str, Any] = {"path": path}
        if ttl_seconds:
            body["ttl_seconds"] = int(ttl_seconds)
        return (await self.client._json(_ops.jreq("POST", _ops.sb_path(self.id, "ports", str(int(port)), "url"),
                                                  body)))["url"]

    async def terminal_url(self) -> str:
        """See :meth:`libdsec.Sandbox.terminal_url`."""
        return (await self.client._json(_ops.jreq("POST", _ops.sb_path(self.id, "terminal", "url"))))["url"]

    async def vnc_url(self) -> str:
        """See :meth:`libdsec.Sandbox.vnc_url`."""
        return (await self.client._json(_ops.jreq("POST", _ops.sb_path(self.id, "vnc", "url"))))["url"]

    def port_path(self, port: int, path: str = "/") -> str:
        return _ops.sb_path(self.id, "ports", str(int(port))) + ("/" + path.lstrip("/"))

    async def processes(self) -> List["AsyncProcess"]:
        d = await self.client._json(_ops.jreq("GET", _ops.proc_path(self.id)))
        return [AsyncProcess(self, ProcessInfo.from_json(p)) for p in d["processes"]]

    async def process(self, pid: str) -> "AsyncProcess":
        """A background process by id (``p-1``...)."""
        return await AsyncProcess(self, ProcessInfo(id=pid)).refresh()

    async def screenshot(self) -> bytes:
        resp = await self.client._send(_ops.screen(self.id, self.client.timeout))
        return await resp.read(self.client.timeout)

    async def input(self, actions: List[Dict[str, Any]]) -> Dict[str, Any]:
        return await self.client._json(_ops.input_req(self.id, actions))

    async def click(self, x: int, y: int, button: str = "left") -> Dict[str, Any]:
        return await self.input([_ops.act_click(x, y, button)])

    async def double_click(self, x: int, y: int, button: str = "left") -> Dict[str, Any]:
        return await self.input([_ops.act_click(x, y, button, 2)])

    async def move(self, x: int, y: int) -> Dict[str, Any]:
        return await self.input([_ops.act_move(x, y)])

    async def drag(self, x0: int, y0: int, x1: int, y1: int) -> Dict[str, Any]:
        return await self.input([_ops.act_drag(x0, y0, x1, y1)])

    async def scroll(self, x: int, y: int, dx: int = 0, dy: int = 0) -> Dict[str, Any]:
        return await self.input([_ops.act_scroll(x, y, dx, dy)])

    async def type(self, text: str) -> Dict[str, Any]:
        return await self.input([_ops.act_type(text)])

    async def key(self, keys: str) -> Dict[str, Any]:
        return await self.input([_ops.act_key(keys)])

    async def read_file(self, path: str) -> bytes:
        resp = await self.client._send(_ops.files("GET", self.id, path, self.client.timeout))
        return await resp.read(self.client.timeout)

    async def read_text(self, path: str) -> str:
        return (await self.read_file(path)).decode("utf-8")

    async def write_file(self, path: str, data: Union[bytes, str], *, mode: Optional[int] = None) -> None:
        req = _ops.files("PUT", self.id, path, self.client.timeout, mode=None if mode is None else format(mode, "o"))
        req.body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        req.headers["Content-Type"] = "application/octet-stream"
        await (await self.client._send(req)).read(self.client.timeout)

    async def list_dir(self, path: str) -> List[FileInfo]:
        d = await self.client._json(_ops.files("GET", self.id, path, self.client.timeout, list="1"))
        return [FileInfo.from_json(e) for e in d["entries"]]

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        req = _ops.files("DELETE", self.id, path, self.client.timeout, recursive="1" if recursive else None)
        await (await self.client._send(req)).read(self.client.timeout)

    async def _lifecycle(self, op: str) -> "AsyncSandbox":
        self.info = SandboxInfo.from_json(await self.client._json(_ops.lifecycle(self.id, op, _ops.CREATE_TIMEOUT)))
        return self

    async def reset(self) -> "AsyncSandbox":
        return await self._lifecycle("reset")

    async def pause(self, memory: Optional[str] = None) -> "AsyncSandbox":
        """See :meth:`libdsec.Sandbox.pause`."""
        if memory:
            d = await self.client._json(_ops.pause(self.id, memory, _ops.CREATE_TIMEOUT))
            self.info = SandboxInfo.from_json(d)
            return self
        return await self._lifecycle("pause")

    async def resume(self) -> "AsyncSandbox":
        return await self._lifecycle("resume")

    async def fork(self, count: int, *, labels: Optional[Mapping[str, str]] = None, trajectory: Optional[str] = None,
                   trajectory_ids: Optional[Sequence[str]] = None, ttl_seconds: Optional[int] = None,
                   timeout: Optional[float] = None) -> List["AsyncSandbox"]:
        """Makes ``count`` copies of this sandbox's state now; see
        :meth:`libdsec.Sandbox.fork`."""
        d = await self.client._json(_ops.fork(self.id, count, labels, trajectory, trajectory_ids, ttl_seconds, timeout))
        out = [AsyncSandbox(self.client, SandboxInfo.from_json(x)) for x in d["sandboxes"]]
        for sb, tr in zip(out, d.get("trajectories") or []):
            sb.trajectory = tr["id"]
        return out

    async def snapshot(self) -> str:
        d = await self.client._json(_ops.jreq("POST", _ops.sb_path(self.id, "snapshot"), None, timeout=600.0))
        return d["ref"]

    async def set_phase(self, phase: str) -> "AsyncSandbox":
        d = await self.client._json(_ops.jreq("PUT", _ops.sb_path(self.id, "phase"), {"phase": phase}))
        if isinstance(d, dict) and "id" in d:
            self.info = SandboxInfo.from_json(d)
        else:
            self.info.phase = phase
        return self

    async def renew(self, ttl_seconds: Optional[int] = None) -> "AsyncSandbox":
        """Extends the lease: the sandbox now expires ``ttl_seconds`` from now
        (its own TTL when not given)."""
        self.info = SandboxInfo.from_json(await self.client._json(_ops.renew(self.id, ttl_seconds)))
        return self

    def keepalive(self, ttl_seconds: Optional[int] = None) -> "asyncio.Task[None]":
        """Renews the lease from a task, every third of the TTL, until the
        task is cancelled (``async with`` does both)."""
        async def run() -> None:
            interval = _ops.keepalive_interval(self.info.raw, ttl_seconds)
            while True:
                await asyncio.sleep(interval)
                try:
                    await self.renew(ttl_seconds)
                except ApiError as e:
                    if e.code == "not_found":
                        return
                except DsecError:
                    pass
        return asyncio.get_running_loop().create_task(run())

    async def close(self) -> None:
        ka = getattr(self, "_keepalive", None)
        if ka is not None:
            ka.cancel()
        await self.client.delete(self.id)
        self.info.state = "deleted"

    delete = close

    async def __aenter__(self) -> "AsyncSandbox":
        self._keepalive = self.keepalive()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncExecStream:
    """The output of a streamed exec: ``async for chunk in stream``;
    ``result`` is set at the end."""

    def __init__(self, resp: AsyncResponse, read_timeout: float) -> None:
        self._resp = resp
        self._timeout = read_timeout
        self._lines = resp.iter_lines(read_timeout)
        self.result: Optional[ExecResult] = None

    def __aiter__(self) -> "AsyncExecStream":
        return self

    async def __anext__(self) -> OutputChunk:
        if self.result is not None:
            raise StopAsyncIteration
        if self._resp.headers.get("content-type", "").startswith("application/json"):
            self.result = ExecResult.from_json(json.loads(await self._resp.read(self._timeout)))
            raise StopAsyncIteration
        async for line in self._lines:
            ev = parse_exec_event(json.loads(line))
            if isinstance(ev, OutputChunk):
                return ev
            if isinstance(ev, ExecResult):
                self.result = ev
                async for _ in self._lines:
                    pass
                raise StopAsyncIteration
            if isinstance(ev, ApiError):
                self.close()
                raise ev
        raise DsecError("exec stream ended without a result")

    async def wait(self) -> ExecResult:
        async for _ in self:
            pass
        assert self.result is not None
        return self.result

    def close(self) -> None:
        self._resp.close()

    async def __aenter__(self) -> "AsyncExecStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class AsyncProcess:
    """A background command, for asyncio; see :class:`libdsec.Process`."""

    def __init__(self, sandbox: AsyncSandbox, info: ProcessInfo) -> None:
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

    def _path(self, rest: str = "") -> str:
        return _ops.proc_path(self.sandbox.id, self.id, rest)

    async def refresh(self) -> "AsyncProcess":
        self.info = ProcessInfo.from_json(await self.sandbox.client._json(_ops.jreq("GET", self._path())))
        return self

    async def wait(self, timeout: Optional[float] = None) -> "AsyncProcess":
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 300.0 if deadline is None else max(0.0, deadline - time.monotonic())
            step = min(left, 300.0)
            req = _ops.jreq("GET", self._path("wait"), query=[("timeout_ms", str(int(step * 1000)))],
                            timeout=step + _ops.EXEC_MARGIN)
            self.info = ProcessInfo.from_json(await self.sandbox.client._json(req))
            if not self.info.running or (deadline is not None and time.monotonic() >= deadline):
                return self

    async def output(self, stream: str = "stdout", offset: int = 0) -> OutputPage:
        req = _ops.jreq("GET", self._path("output"), query=[("stream", stream), ("offset", str(offset))])
        resp = await self.sandbox.client._send(req)
        data = await resp.read(self.sandbox.client.timeout)
        h = resp.headers
        return OutputPage(data, int(h.get("x-dsec-offset", offset)), int(h.get("x-dsec-next-offset", offset + len(data))),
                          int(h.get("x-dsec-dropped", 0)))

    async def follow(self, stream: str = "stdout", offset: int = 0, *,
                     timeout: float = 3600.0) -> AsyncIterator[bytes]:
        req = _ops.jreq("GET", self._path("output"),
                        query=[("stream", stream), ("offset", str(offset)), ("follow", "1")], timeout=timeout)
        resp = await self.sandbox.client._send(req)
        try:
            async for chunk in resp.iter_chunks(timeout):
                yield chunk
        finally:
            resp.close()

    async def logs(self, *, follow: bool = False, stream: Optional[str] = None, offset: int = 0,
                   stderr_offset: int = 0, timeout: float = 3600.0) -> AsyncIterator[OutputChunk]:
        """See :meth:`libdsec.Process.logs`."""
        req = _ops.jreq("GET", self._path("output"), query=_ops.logs_query(stream, offset, stderr_offset, follow),
                        timeout=timeout)
        req.headers["Accept"] = "application/x-ndjson"
        resp = await self.sandbox.client._send(req)
        try:
            async for line in resp.iter_lines(timeout):
                ev = parse_output_event(json.loads(line))
                if isinstance(ev, OutputChunk):
                    yield ev
                elif isinstance(ev, ExecResult):
                    await self.refresh()
        finally:
            resp.close()

    async def signal(self, sig: str = "TERM") -> "AsyncProcess":
        req = _ops.jreq("POST", self._path("signal"), None, query=[("signal", sig)])
        self.info = ProcessInfo.from_json(await self.sandbox.client._json(req))
        return self

    async def kill(self) -> "AsyncProcess":
        return await self.signal("KILL")

    async def forget(self) -> None:
        await (await self.sandbox.client._send(_ops.jreq("DELETE", self._path()))).read(self.sandbox.client.timeout)


class AsyncBatchResult:
    """What a batch create made; ``async with`` destroys the created sandboxes on exit."""

    def __init__(self, client: AsyncClient, result: Dict[str, Any], items: List[BatchItem]) -> None:
        self.client = client
        self.batch: str = result.get("batch", "")
        self.requested = int(result.get("requested", 0))
        self.created = int(result.get("created", 0))
        self.failed = int(result.get("failed", 0))
        self.duration_ms = int(result.get("duration_ms", 0))
        self.items = items

    @property
    def sandboxes(self) -> List[AsyncSandbox]:
        return [self.client.sandbox(it.id) for it in self.items if it.error is None and it.id]

    @property
    def errors(self) -> List[BatchItem]:
        return [it for it in self.items if it.error is not None]

    async def close_all(self, parallel: int = 32) -> None:
        sem = asyncio.Semaphore(parallel)

        async def one(sb: AsyncSandbox) -> None:
            async with sem:
                await sb.close()

        await asyncio.gather(*(one(sb) for sb in self.sandboxes))

    async def __aenter__(self) -> "AsyncBatchResult":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close_all()
