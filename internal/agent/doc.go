// Package agent is dsec-agent, the executor that runs inside every sandbox:
// PID 1 of an OCI container, or the init of a microVM. It serves an
// HTTP/1.1 API on a listener handed to it by the host-side edge — run a
// command (buffered, streamed as NDJSON, or in the background), read, write,
// list and remove files — and does the duties of an init: it reaps every
// child, forwards termination signals to the process groups it started, and
// keeps itself non-dumpable so sandboxed processes cannot ptrace it or open
// its file descriptors. Client is the edge's side of the same API.
//
// The routes, with errors as {"error":{"code","message"}}:
//
//	GET    /healthz                      Health
//	POST   /exec                         api.ExecRequest → api.ExecResult, or NDJSON api.ExecEvent
//	                                     lines with Accept: application/x-ndjson
//	GET    /procs                        ProcessList of background processes
//	GET    /procs/{id}                   api.Process
//	GET    /procs/{id}/wait?timeout_ms=  api.Process once exited (or timed out)
//	GET    /procs/{id}/output?stream=stdout|stderr&offset=&follow=1
//	                                     raw bytes; X-Dsec-Offset, X-Dsec-Next-Offset, X-Dsec-Dropped
//	POST   /procs/{id}/signal?signal=TERM|KILL|INT|HUP|QUIT|USR1|USR2
//	DELETE /procs/{id}                   forget an exited process
//	GET    /files?path=[&list=1]         raw bytes, or api.FileList
//	PUT    /files?path=[&mode=0644]      raw body → FileWritten
//	DELETE /files?path=[&recursive=1]
//	POST   /fs/freeze?timeout_ms=         freeze the writable disk (microVM only: Config.Freezer)
//	POST   /fs/thaw
//	GET    /display                      api.Display of the sandbox's X server (400: none)
//	GET    /screen                       the X screen as image/png; X-Display-Width, -Height
//	POST   /input                        api.InputRequest → api.InputResult (XTEST)
//	GET    /vnc                          WebSocket: RFB of the X screen's VNC server (x11vnc on
//	                                     VNCSocket); 400: no X server or no VNC server
//
// The agent must never let a sandboxed process reach its listener (the
// socket is inherited, never a path inside the sandbox, and never leaks into
// children), never resolve a file path outside its root (every path goes
// through openat2 with RESOLVE_IN_ROOT), never buffer a command's output or
// an uploaded file without a bound, and never wait for a child by any means
// but its one reaper: a second wait4 caller would steal exit statuses.
package agent
