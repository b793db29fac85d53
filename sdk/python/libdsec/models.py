"""Plain data of the dsec API: sandboxes, exec results, processes, files,
layers, batch results, policy profiles. Each has a ``from_json`` that reads the API's JSON
and keeps the raw dict in ``raw`` for fields this version does not know."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional

from .errors import ApiError, ExecError, error_from_code

__all__ = [
    "SandboxInfo",
    "ExecResult",
    "OutputChunk",
    "ProcessInfo",
    "OutputPage",
    "FileInfo",
    "Layer",
    "BatchItem",
    "BatchProgress",
    "Pool",
    "Profile",
    "Trajectory",
    "Health",
    "Node",
    "Admission",
    "Tenant",
    "APIKey",
    "Checkpoint",
    "TrajectoryLog",
]


def _b(s: str, encoding: Optional[str]) -> bytes:
    if encoding == "base64":
        return base64.b64decode(s)
    return s.encode("utf-8")


@dataclass
class SandboxInfo:
    """A sandbox as the API describes it."""

    id: str
    backend: str
    state: str
    node: str = ""
    layers: Dict[str, str] = field(default_factory=dict)
    resources: Dict[str, Any] = field(default_factory=dict)
    labels: Dict[str, str] = field(default_factory=dict)
    env: Dict[str, str] = field(default_factory=dict)
    phase: str = ""
    snapshot: str = ""
    error: str = ""
    created_at: str = ""
    expires_at: str = ""
    burst: bool = False  # it may run on a cloud burst node
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "SandboxInfo":
        return cls(
            id=d["id"],
            backend=d.get("backend", ""),
            state=d.get("state", ""),
            node=d.get("node", ""),
            layers=d.get("layers") or {},
            resources=d.get("resources") or {},
            labels=d.get("labels") or {},
            env=d.get("env") or {},
            phase=d.get("phase", ""),
            snapshot=d.get("snapshot", ""),
            error=d.get("error", ""),
            created_at=d.get("created_at", ""),
            expires_at=d.get("expires_at", ""),
            burst=bool(d.get("burst", False)),
            raw=d,
        )


@dataclass
class ExecResult:
    """The outcome of a command.

    ``stdout``/``stderr`` are text (undecodable bytes replaced);
    ``stdout_bytes``/``stderr_bytes`` are the exact bytes. When the output
    went over its cap, the head and tail are kept and ``truncated`` is set.
    """

    exit_code: int
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    signal: str = ""
    truncated: bool = False
    stdout_dropped: int = 0
    stderr_dropped: int = 0
    timed_out: bool = False
    duration_ms: int = 0
    replayed: bool = False
    process: Optional["ProcessInfo"] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        """True if the command exited 0 and did not time out."""
        return self.exit_code == 0 and not self.timed_out

    def check(self) -> "ExecResult":
        """Raises :class:`libdsec.ExecError` unless the command succeeded."""
        if not self.ok:
            raise ExecError(self)
        return self

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ExecResult":
        enc = d.get("encoding")
        proc = d.get("process")
        return cls(
            exit_code=int(d.get("exit_code", 0)),
            stdout_bytes=_b(d.get("stdout", ""), enc),
            stderr_bytes=_b(d.get("stderr", ""), enc),
            signal=d.get("signal", ""),
            truncated=bool(d.get("truncated", False)),
            stdout_dropped=int(d.get("stdout_dropped", 0)),
            stderr_dropped=int(d.get("stderr_dropped", 0)),
            timed_out=bool(d.get("timed_out", False)),
            duration_ms=int(d.get("duration_ms", 0)),
            replayed=bool(d.get("replayed", False)),
            process=ProcessInfo.from_json(proc) if proc else None,
            raw=d,
        )


@dataclass
class OutputChunk:
    """One piece of a streamed command's output."""

    stream: str  # "stdout" or "stderr"
    data: bytes
    #: where ``data`` starts in its stream (process logs; 0 for an exec)
    offset: int = 0

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def parse_output_event(d: Dict[str, Any]) -> Any:
    """One NDJSON process log event: an OutputChunk, or the final ExecResult."""
    if d.get("exit") is not None:
        return ExecResult.from_json(d["exit"])
    if d.get("data") is not None:
        return OutputChunk(d.get("stream", "stdout"), _b(d["data"], d.get("encoding")), int(d.get("offset", 0)))
    return None


def parse_exec_event(d: Dict[str, Any]) -> Any:
    """One NDJSON exec event: an OutputChunk, the final ExecResult, or an ApiError."""
    if "stdout" in d:
        return OutputChunk("stdout", _b(d["stdout"], d.get("encoding")))
    if "stderr" in d:
        return OutputChunk("stderr", _b(d["stderr"], d.get("encoding")))
    if "exit" in d:
        return ExecResult.from_json(d["exit"])
    if "error" in d:
        e = d["error"]
        return error_from_code(e.get("code", "internal"), e.get("message", ""))
    return None


@dataclass
class ProcessInfo:
    """A background command inside a sandbox."""

    id: str
    pid: int = 0
    running: bool = False
    started_at: str = ""
    exited_at: str = ""
    result: Optional[ExecResult] = None
    output_size: int = 0

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ProcessInfo":
        res = d.get("result")
        return cls(
            id=d["id"],
            pid=int(d.get("pid", 0)),
            running=bool(d.get("running", False)),
            started_at=d.get("started_at", ""),
            exited_at=d.get("exited_at", "") or "",
            result=ExecResult.from_json(res) if res else None,
            output_size=int(d.get("output_size", 0)),
        )


@dataclass
class OutputPage:
    """Bytes of a background process's stream, from ``offset`` to ``next_offset``."""

    data: bytes
    offset: int
    next_offset: int
    dropped: int


@dataclass
class FileInfo:
    """One entry of a directory listing."""

    name: str
    type: str
    size: int
    mode: int
    mod_time: str
    target: str = ""

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "FileInfo":
        return cls(d["name"], d.get("type", ""), int(d.get("size", 0)), int(d.get("mode", 0)),
                   d.get("mod_time", ""), d.get("target", ""))


@dataclass
class Layer:
    """A read-only filesystem layer."""

    ref: str
    name: str
    tag: str
    digest: str
    kind: str
    size: int
    public: bool
    created_at: str = ""

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Layer":
        return cls(d["ref"], d["name"], d["tag"], d["digest"], d["kind"], int(d.get("size", 0)),
                   bool(d.get("public", False)), d.get("created_at", ""))


@dataclass
class BatchProgress:
    """Counts of a batch create so far."""

    total: int
    placed: int
    created: int
    failed: int

    @property
    def done(self) -> int:
        return self.created + self.failed


@dataclass
class BatchItem:
    """The outcome of one sandbox of a batch."""

    index: int
    id: str = ""
    node: str = ""
    state: str = ""
    error: Optional[ApiError] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "BatchItem":
        e = d.get("error")
        err = error_from_code(e.get("code", "internal"), e.get("message", "")) if e else None
        return cls(int(d.get("index", 0)), d.get("id", ""), d.get("node", ""), d.get("state", ""), err)


@dataclass
class Pool:
    """A warm FnCall pool of the tenant."""

    id: str
    layers: Dict[str, str]
    size: int
    idle: int
    busy: int
    resetting: int
    creating: int
    waiting: int
    target: int
    min: int
    max: int
    calls: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Pool":
        g = lambda k: int(d.get(k, 0))  # noqa: E731
        return cls(d["id"], d.get("layers") or {}, g("size"), g("idle"), g("busy"), g("resetting"),
                   g("creating"), g("waiting"), g("target"), g("min"), g("max"), g("calls"), d)


@dataclass
class Profile:
    """A named set of policy phases (``GET /v1/profiles``): ``create(profile=name)``
    gives a sandbox these ``phases`` and starts it in ``phase``. Each phase
    is the API's JSON of it (``{"network": ..., "files": ...}``)."""

    name: str
    phase: str
    phases: Dict[str, Dict[str, Any]]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, name: str, d: Dict[str, Any]) -> "Profile":
        return cls(name, d.get("phase", ""), d.get("phases") or {}, d)


@dataclass
class Trajectory:
    """Keys an exec into the trajectory log: the same (id, step) replays.

    ``checkpoint_every=K`` (a setting of the trajectory from this step on)
    has the server snapshot the sandbox after every step that is a multiple
    of K, so that a lost sandbox can be restored
    (:meth:`libdsec.Client.restore_trajectory`); ``checkpoint_every=-1``
    stops them."""

    id: str
    step: int
    checkpoint_every: int = 0



class _Answer:
    """An API answer as a dataclass whose fields are its JSON's keys. For
    code written when these answers were dicts, ``answer["key"]``,
    ``answer.get("key")`` and ``"key" in answer`` read the JSON (``raw``)
    too."""

    raw: Dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.raw

    @classmethod
    def from_json(cls, d: Dict[str, Any]):  # type: ignore[no-untyped-def]
        kw = {f.name: d[f.name] for f in fields(cls) if f.name != "raw" and d.get(f.name) is not None}  # type: ignore[arg-type]
        return cls(**kw, raw=d)  # type: ignore[call-arg]


@dataclass
class Health(_Answer):
    """``GET /healthz``: the server serves, with ``nodes`` connected."""

    ok: bool = False
    nodes: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Node(_Answer):
    """A node of the cluster (admin key): ``state`` is ``up``, ``down`` or
    ``draining``; resources are the API's JSON of them."""

    id: str = ""
    addr: str = ""
    state: str = ""
    capacity: Dict[str, Any] = field(default_factory=dict)
    limit: Dict[str, Any] = field(default_factory=dict)
    allocated: Dict[str, Any] = field(default_factory=dict)
    sandboxes: int = 0
    load: Dict[str, Any] = field(default_factory=dict)
    backends: List[str] = field(default_factory=list)
    labels: Dict[str, str] = field(default_factory=dict)
    pool: str = ""
    cached_layers: int = 0
    last_seen: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Admission(_Answer):
    """The answering server's admission queue: creates waiting for busy nodes."""

    waiting: int = 0
    tenants: int = 0
    oldest_wait_ms: int = 0
    admitted: int = 0
    timed_out: int = 0
    left: int = 0
    max_cpu_load: float = 0.0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Tenant(_Answer):
    """A tenant; ``quota`` (0 or absent: unlimited) and ``usage`` where the
    call reports them."""

    id: str = ""
    name: str = ""
    created_at: str = ""
    quota: Dict[str, Any] = field(default_factory=dict)
    usage: Dict[str, Any] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class APIKey(_Answer):
    """An API key of a tenant, without its secret."""

    id: str = ""
    tenant: str = ""
    admin: bool = False
    created_at: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Checkpoint(_Answer):
    """A checkpoint of a trajectory: the sandbox's snapshot after ``step``."""

    step: int = 0
    snapshot: str = ""
    digest: str = ""
    size: int = 0
    sandbox: str = ""
    generation: int = 0
    created_at: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class TrajectoryLog(_Answer):
    """A trajectory's log: its ``steps`` (the API's JSON of each, without
    output) and ``checkpoints``."""

    id: str = ""
    steps: List[Dict[str, Any]] = field(default_factory=list)
    checkpoint_every: int = 0
    checkpoints: List[Checkpoint] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "TrajectoryLog":
        return cls(d.get("id", ""), d.get("steps") or [], int(d.get("checkpoint_every") or 0),
                   [Checkpoint.from_json(c) for c in d.get("checkpoints") or []], d)
