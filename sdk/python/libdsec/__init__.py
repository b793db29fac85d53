"""libdsec: the Python SDK of dsec, sandboxes for agentic RL at scale.

Standard library only, Python 3.9+, blocking (:class:`Client`) and asyncio
(:class:`AsyncClient`)::

    import libdsec
    client = libdsec.Client()                    # $DSEC_URL, $DSEC_API_KEY
    with client.create(layers={"base": "debian:12", "workspace": "repo-x:v3"}) as sb:
        r = sb.exec("pytest -q", timeout=600)    # r.exit_code, r.stdout, r.stderr
        sb.write_file("/work/a.py", b"...")
        sb.reset()
    batch = client.create_batch(1000, base="base:minimal", memory_mb=64, progress=True)
    r = client.fncall(["python3", "-c", "print(1+1)"], base="debian:12")

Errors from the server raise the subclass of :class:`ApiError` of their code
(:class:`NotFoundError`, :class:`InvalidArgumentError`, ...) with the server's
message. Every call has a timeout; idempotent calls are retried with backoff
on 429, 503 and broken connections.
"""

from ._terminal import AsyncTerminal, Terminal
from .aio import AsyncBatchResult, AsyncClient, AsyncExecStream, AsyncProcess, AsyncSandbox
from .client import BatchResult, Client, ExecStream, Process, Sandbox, progress_bar
from .errors import (AlreadyExistsError, ApiError, DeadlineExceededError, DsecConnectionError, DsecError,
                     DsecTimeoutError, ExecError, FailedPreconditionError, InternalError, InvalidArgumentError,
                     NotFoundError, PermissionDeniedError, ResourceExhaustedError, TooLargeError, UnauthenticatedError,
                     UnavailableError)
from .models import (Admission, APIKey, BatchItem, BatchProgress, Checkpoint, ExecResult, FileInfo, Health, Layer, Node,
                     OutputChunk, OutputPage, Pool, ProcessInfo, Profile, SandboxInfo, Tenant, Trajectory, TrajectoryLog)

__version__ = "0.1.0"

__all__ = [
    "Client", "Sandbox", "Process", "ExecStream", "BatchResult", "progress_bar",
    "AsyncClient", "AsyncSandbox", "AsyncProcess", "AsyncExecStream", "AsyncBatchResult",
    "Terminal", "AsyncTerminal",
    "DsecError", "ApiError", "InvalidArgumentError", "UnauthenticatedError", "PermissionDeniedError",
    "NotFoundError", "AlreadyExistsError", "FailedPreconditionError", "TooLargeError", "ResourceExhaustedError",
    "DeadlineExceededError", "UnavailableError", "InternalError", "DsecConnectionError", "DsecTimeoutError",
    "ExecError",
    "SandboxInfo", "ExecResult", "OutputChunk", "ProcessInfo", "OutputPage", "FileInfo", "Layer", "BatchItem",
    "BatchProgress", "Pool", "Profile", "Trajectory", "Health", "Node", "Admission", "Tenant", "APIKey", "Checkpoint",
    "TrajectoryLog",
]
