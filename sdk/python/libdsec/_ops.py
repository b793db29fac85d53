"""The API calls as data: each function returns a :class:`Req` saying what to
send and how to retry it; the sync and asyncio clients only differ in how
they send it. Nothing here does I/O."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote, urlencode

from .models import Trajectory

# Margins added to a command's own timeout for the HTTP call that waits for it.
EXEC_MARGIN = 30.0
# A create may wait for admission while the nodes with room are busy (60 s
# unless its admission_timeout_seconds says otherwise), then up to 2 min
# for its node to build it.
ADMISSION_TIMEOUT = 60.0
BUILD_TIMEOUT = 120.0
CREATE_TIMEOUT = ADMISSION_TIMEOUT + BUILD_TIMEOUT + 20.0
DEFAULT_EXEC_TIMEOUT = 600.0  # the server's default for exec

Cmd = Union[str, Sequence[str]]
Layers = Union[str, Mapping[str, str], None]


@dataclass
class Req:
    """One HTTP call.

    ``idempotent`` calls are retried on 429, 503 and connection failures;
    others only on 429 when ``retry_busy`` says the refusal happens before
    any work (no room on a node, no free sandbox).
    """

    method: str
    path: str
    query: List[Tuple[str, str]] = field(default_factory=list)
    body: Optional[bytes] = None
    headers: Dict[str, str] = field(default_factory=dict)
    timeout: Optional[float] = None
    idempotent: bool = False
    retry_busy: bool = False
    stream: bool = False

    @property
    def target(self) -> str:
        return self.path + ("?" + urlencode(self.query) if self.query else "")


def jreq(method: str, path: str, obj: Any = None, **kw: Any) -> Req:
    r = Req(method, path, **kw)
    if obj is not None:
        r.body = json.dumps(obj, separators=(",", ":")).encode("utf-8")
        r.headers["Content-Type"] = "application/json"
    if r.idempotent is False and method in ("GET", "HEAD", "PUT", "DELETE"):
        r.idempotent = True
    return r


def sb_path(sid: str, *rest: str) -> str:
    p = "/v1/sandboxes/" + quote(sid, safe="")
    for part in rest:
        p += "/" + part
    return p


def layers_obj(layers: Layers, base: Optional[str], workspace: Optional[str], toolkit: Optional[str]) -> Optional[Dict[str, str]]:
    if isinstance(layers, str):
        out = {"base": layers}
    elif layers is not None:
        out = {k: v for k, v in dict(layers).items() if v}
    else:
        out = {}
    for k, v in (("base", base), ("workspace", workspace), ("toolkit", toolkit)):
        if v:
            out[k] = v
    return out or None


def spec(
    *,
    layers: Layers = None,
    base: Optional[str] = None,
    workspace: Optional[str] = None,
    toolkit: Optional[str] = None,
    backend: Optional[str] = None,
    snapshot: Optional[str] = None,
    resources: Optional[Mapping[str, Any]] = None,
    cpu: Optional[float] = None,
    memory_mb: Optional[int] = None,
    disk_mb: Optional[int] = None,
    pids: Optional[int] = None,
    network: Union[str, Mapping[str, Any], None] = None,
    phase: Optional[str] = None,
    ttl_seconds: Optional[int] = None,
    labels: Optional[Mapping[str, str]] = None,
    env: Optional[Mapping[str, str]] = None,
    phases: Optional[Mapping[str, Any]] = None,
    profile: Optional[str] = None,
    idle_timeout_seconds: Optional[int] = None,
    burst: bool = False,
    admission_timeout_seconds: Optional[int] = None,
) -> Dict[str, Any]:
    """The JSON of a create request (also the spec of a batch)."""
    d: Dict[str, Any] = {}
    lo = layers_obj(layers, base, workspace, toolkit)
    if lo:
        d["layers"] = lo
    res = dict(resources or {})
    for k, v in (("cpu", cpu), ("memory_mb", memory_mb), ("disk_mb", disk_mb), ("pids", pids)):
        if v is not None:
            res[k] = v
    if res:
        d["resources"] = res
    if phases:
        d["phases"] = {k: dict(v) for k, v in phases.items()}
    for k, v in (("backend", backend), ("snapshot", snapshot), ("phase", phase), ("ttl_seconds", ttl_seconds),
                 ("profile", profile), ("idle_timeout_seconds", idle_timeout_seconds)):
        if v:
            d[k] = v
    if network is not None:
        d["network"] = network if isinstance(network, str) else dict(network)
    if labels:
        d["labels"] = dict(labels)
    if env:
        d["env"] = dict(env)
    if burst:
        d["burst"] = True
    if admission_timeout_seconds:
        d["admission_timeout_seconds"] = int(admission_timeout_seconds)
    return d


def create_timeout(body: Dict[str, Any]) -> float:
    """How long to wait for a create's answer: its wait for admission (see
    ``admission_timeout_seconds``) plus the build, with a margin."""
    wait = body.get("admission_timeout_seconds") or ADMISSION_TIMEOUT
    return max(float(wait), 0.0) + BUILD_TIMEOUT + 20.0


def create(body: Dict[str, Any], timeout: Optional[float]) -> Req:
    # 429 (no room) is refused before anything is made: safe to retry. A
    # create that only waits for busy nodes is not refused: the server holds
    # it in its admission queue, so the call's timeout covers that wait.
    return jreq("POST", "/v1/sandboxes", body, timeout=timeout or create_timeout(body), retry_busy=True)


def batch(count: int, body: Dict[str, Any], timeout: Optional[float]) -> Req:
    d = dict(body)
    d["count"] = count
    r = jreq("POST", "/v1/sandboxes:batch", d, timeout=timeout or 120.0, stream=True)
    r.headers["Accept"] = "application/x-ndjson"
    return r


def _stdin(stdin: Union[str, bytes, None], d: Dict[str, Any]) -> None:
    if stdin is None:
        return
    if isinstance(stdin, str):
        stdin = stdin.encode("utf-8")
    d["stdin"] = base64.b64encode(stdin).decode("ascii")
    d["stdin_encoding"] = "base64"


def exec_body(
    cmd: Cmd,
    *,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    stdin: Union[str, bytes, None] = None,
    timeout: Optional[float] = None,
    max_output_bytes: Optional[int] = None,
    trajectory: Union[Trajectory, Tuple[str, int], Tuple[str, int, int], Mapping[str, Any], None] = None,
    background: bool = False,
    tty: Optional[Tuple[int, int]] = None,
) -> Dict[str, Any]:
    """The JSON of an exec: ``cmd`` is a shell string or an argv list."""
    d: Dict[str, Any] = {}
    if isinstance(cmd, str):
        d["shell"] = cmd
    else:
        d["cmd"] = list(cmd)
    if env:
        d["env"] = dict(env)
    if cwd:
        d["cwd"] = cwd
    _stdin(stdin, d)
    if timeout is not None:
        d["timeout_ms"] = max(1, int(timeout * 1000))
    if max_output_bytes is not None:
        d["max_output_bytes"] = int(max_output_bytes)
    if trajectory is not None:
        if isinstance(trajectory, Trajectory):
            d["trajectory"] = {"id": trajectory.id, "step": trajectory.step}
            if trajectory.checkpoint_every:
                d["trajectory"]["checkpoint_every"] = int(trajectory.checkpoint_every)
        elif isinstance(trajectory, tuple):
            d["trajectory"] = {"id": trajectory[0], "step": int(trajectory[1])}
            if len(trajectory) > 2 and trajectory[2]:
                d["trajectory"]["checkpoint_every"] = int(trajectory[2])
        else:
            d["trajectory"] = dict(trajectory)
    if background:
        d["background"] = True
    if tty is not None:
        d["tty"] = {"rows": int(tty[0]), "cols": int(tty[1])}
    return d


def http_timeout(cmd_timeout: Optional[float], default: float = DEFAULT_EXEC_TIMEOUT) -> float:
    return (cmd_timeout if cmd_timeout is not None else default) + EXEC_MARGIN


def exec_(sid: str, body: Dict[str, Any], cmd_timeout: Optional[float], stream: bool) -> Req:
    # An exec with a trajectory key is replayed, not re-run, by a server
    # that keeps the log: resending it is safe.
    r = jreq("POST", sb_path(sid, "exec"), body, timeout=http_timeout(cmd_timeout),
             idempotent="trajectory" in body, stream=stream)
    if stream:
        r.headers["Accept"] = "application/x-ndjson"
    return r


def fncall(body: Dict[str, Any], call_timeout: Optional[float], stream: bool = False) -> Req:
    r = jreq("POST", "/v1/fncall", body, timeout=http_timeout(call_timeout, 60.0), retry_busy=True, stream=stream)
    if stream:
        r.headers["Accept"] = "application/x-ndjson"
    return r


def fncall_body(cmd: Cmd, layers: Layers, base: Optional[str], workspace: Optional[str], toolkit: Optional[str],
                resources: Optional[Mapping[str, Any]], **kw: Any) -> Dict[str, Any]:
    d = exec_body(cmd, **kw)
    d["layers"] = layers_obj(layers, base, workspace, toolkit) or {"base": "base:minimal"}
    if resources:
        d["resources"] = dict(resources)
    return d


def lifecycle(sid: str, op: str, timeout: float) -> Req:
    # A reset twice is a reset; pause and resume are not repeatable.
    return jreq("POST", sb_path(sid, op), None, timeout=timeout, idempotent=op == "reset")


def pause(sid: str, memory: str, timeout: float) -> Req:
    # memory: "ram" (the default pause) or "disk" (hibernate a microVM).
    return jreq("POST", sb_path(sid, "pause"), {"memory": memory}, timeout=timeout)


def files(method: str, sid: str, path: str, timeout: float, **q: Any) -> Req:
    query = [("path", path)] + [(k, str(v)) for k, v in q.items() if v is not None]
    return jreq(method, sb_path(sid, "files"), None, query=query, timeout=timeout)


def list_query(labels: Optional[Mapping[str, str]], state: Union[str, Iterable[str], None], all_: bool,
               limit: Optional[int], page_token: str) -> List[Tuple[str, str]]:
    q: List[Tuple[str, str]] = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
    if state:
        q.append(("state", state if isinstance(state, str) else ",".join(state)))
    if all_:
        q.append(("all", "1"))
    if limit:
        q.append(("limit", str(limit)))
    if page_token:
        q.append(("page_token", page_token))
    return q


def proc_path(sid: str, pid: str = "", rest: str = "") -> str:
    p = sb_path(sid, "processes")
    if pid:
        p += "/" + quote(pid, safe="")
    if rest:
        p += "/" + rest
    return p


def renew(sid: str, ttl_seconds: Optional[int]) -> Req:
    """POST /v1/sandboxes/{id}/renew: the lease ends ttl_seconds from now
    (the sandbox's own TTL when None)."""
    return jreq("POST", sb_path(sid, "renew"), {"ttl_seconds": ttl_seconds} if ttl_seconds else None)


def keepalive_interval(info_raw: Dict[str, Any], ttl_seconds: Optional[int]) -> float:
    """How often to renew: a third of the lease, between 1 s and 5 min."""
    ttl = ttl_seconds or int(info_raw.get("ttl_seconds") or 0) or 600
    return float(min(max(ttl / 3.0, 1.0), 300.0))


def trajectory_path(tid: str) -> str:
    # Trajectory ids keep their slashes in the path.
    return "/v1/trajectories/" + quote(tid, safe="/")


def restore(tid: str, step: Optional[int], ttl_seconds: Optional[int], timeout: Optional[float]) -> Req:
    # Not retried: a restore that reached the server made a sandbox.
    body: Dict[str, Any] = {"trajectory": tid}
    if step:
        body["step"] = int(step)
    if ttl_seconds:
        body["ttl_seconds"] = int(ttl_seconds)
    return jreq("POST", "/v1/trajectories:restore", body, timeout=timeout or CREATE_TIMEOUT)


def fork(sid: str, count: int, labels: Optional[Mapping[str, str]], trajectory: Optional[str],
         trajectory_ids: Optional[Sequence[str]], ttl_seconds: Optional[int], timeout: Optional[float]) -> Req:
    # Not retried: a fork that reached the server made sandboxes.
    body: Dict[str, Any] = {"count": int(count)}
    if labels:
        body["labels"] = dict(labels)
    if trajectory:
        body["trajectory"] = {"id": trajectory}
        if trajectory_ids:
            body["trajectory"]["ids"] = list(trajectory_ids)
    if ttl_seconds:
        body["ttl_seconds"] = int(ttl_seconds)
    return jreq("POST", sb_path(sid, "fork"), body, timeout=timeout or 600.0)


def build_context(dockerfile: str, context: Optional[str]) -> bytes:
    """A build context tar: the directory ``context`` (the Dockerfile's by
    default) with the Dockerfile under .dsec-build/Dockerfile."""
    import io
    import os
    import tarfile

    buf = io.BytesIO()
    with open(dockerfile, "rb") as f:
        df = f.read()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo(".dsec-build/Dockerfile")
        ti.size = len(df)
        tf.addfile(ti, io.BytesIO(df))
        root = context or os.path.dirname(os.path.abspath(dockerfile))
        for name in sorted(os.listdir(root)):
            tf.add(os.path.join(root, name), arcname=name)
    return buf.getvalue()


def build(body: bytes, name: str, flatten: bool, kind: Optional[str], network: Optional[str],
          args: Optional[Mapping[str, str]]) -> Req:
    q: List[Tuple[str, str]] = [("name", name), ("dockerfile", ".dsec-build/Dockerfile")]
    if flatten:
        q.append(("flatten", "true"))
    if kind:
        q.append(("kind", kind))
    if network:
        q.append(("network", network))
    for k, v in (args or {}).items():
        q.append(("arg", f"{k}={v}"))
    r = Req("POST", "/v1/layers:build", query=q, body=body, timeout=1800.0, stream=True)
    r.headers["Content-Type"] = "application/x-tar"
    r.headers["Accept"] = "application/x-ndjson"
    return r


def build_event(ev: Dict[str, Any], on_event: Any) -> Optional[Dict[str, Any]]:
    """Handles one build event: the result when it is the last, raises on
    an error event (the message names the Dockerfile line)."""
    if on_event:
        on_event(ev)
    if "error" in ev:
        from .errors import error_from_code

        e = ev["error"]
        err = error_from_code(str(e.get("code", "internal")), str(e.get("message", "")))
        err.line = e.get("line")  # type: ignore[attr-defined]
        err.output = e.get("output", "")  # type: ignore[attr-defined]
        raise err
    return ev.get("result")


def node_path(node_id: str, op: str = "") -> str:
    return "/v1/nodes/" + quote(node_id, safe="") + ("/" + op if op else "")


def tenant_path(tenant_id: str, rest: str = "") -> str:
    return "/v1/tenants/" + quote(tenant_id, safe="") + ("/" + rest if rest else "")


def drain(node_id: str, on: bool) -> Req:
    # Setting a flag to a value twice is setting it once: safe to retry.
    return jreq("POST", node_path(node_id, "drain" if on else "undrain"), None, idempotent=True)


def set_quota(tenant_id: str, sandboxes: int, cpu: float, memory_mb: int) -> Req:
    """PUT /v1/tenants/{id}/quota: the whole quota is replaced; 0 is
    unlimited (the server refuses negative values)."""
    body: Dict[str, Any] = {}
    if sandboxes:
        body["sandboxes"] = int(sandboxes)
    if cpu:
        body["cpu"] = float(cpu)
    if memory_mb:
        body["memory_mb"] = int(memory_mb)
    return jreq("PUT", tenant_path(tenant_id, "quota"), body)


def logs_query(stream: Optional[str], offset: int, stderr_offset: int, follow: bool) -> List[Tuple[str, str]]:
    """The query of a process log read (NDJSON)."""
    q = [("offset", str(int(offset)))]
    if stream:
        q.append(("stream", stream))
    else:
        q.append(("stderr_offset", str(int(stderr_offset))))
    if follow:
        q.append(("follow", "1"))
    return q


# -- screen and input (fullvm sandboxes) ---------------------------------------------------------

INPUT_TIMEOUT = 180.0  # the actions' waits (up to 60 s) and typing under emulation


def screen(sid: str, timeout: float) -> Req:
    return jreq("GET", sb_path(sid, "screen"), timeout=timeout)


def input_req(sid: str, actions: List[Dict[str, Any]]) -> Req:
    return jreq("POST", sb_path(sid, "input"), {"actions": list(actions)}, timeout=INPUT_TIMEOUT)


def act_click(x: int, y: int, button: str = "left", count: int = 1) -> Dict[str, Any]:
    return {"type": "click", "x": x, "y": y, "button": button, "count": count}


def act_move(x: int, y: int) -> Dict[str, Any]:
    return {"type": "move", "x": x, "y": y}


def act_drag(x0: int, y0: int, x1: int, y1: int) -> Dict[str, Any]:
    return {"type": "drag", "from": [x0, y0], "to": [x1, y1]}


def act_scroll(x: int, y: int, dx: int = 0, dy: int = 0) -> Dict[str, Any]:
    return {"type": "scroll", "x": x, "y": y, "dx": dx, "dy": dy}


def act_type(text: str) -> Dict[str, Any]:
    return {"type": "type", "text": text}


def act_key(keys: str) -> Dict[str, Any]:
    return {"type": "key", "keys": keys}
