package swerex

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// command is SWE-ReX's Command.
type command struct {
	Command            json.RawMessage   `json:"command"`
	Timeout            *float64          `json:"timeout"`
	Shell              bool              `json:"shell"`
	Check              bool              `json:"check"`
	ErrorMsg           string            `json:"error_msg"`
	Env                map[string]string `json:"env"`
	Cwd                *string           `json:"cwd"`
	MergeOutputStreams bool              `json:"merge_output_streams"`
	argv               []string
	repr               string
}

// Limits of /execute (those of dsec's exec).
const (
	maxExecSeconds = 86400
	maxExecOutput  = 64 << 20
)

// parse checks the command and sets argv to what subprocess.run(command,
// shell=...) runs.
func (c *command) parse() error {
	if len(c.Command) == 0 || string(c.Command) == "null" {
		return missing("command")
	}
	var s string
	var list []string
	if err := json.Unmarshal(c.Command, &s); err == nil {
		c.repr = pyRepr(s)
		if c.Shell {
			c.argv = []string{"/bin/sh", "-c", s}
		} else {
			c.argv = []string{s} // Python runs the string as the program's name
		}
	} else if err := json.Unmarshal(c.Command, &list); err == nil {
		if len(list) == 0 {
			return pyErr("builtins.IndexError", "list index out of range")
		}
		reprs := make([]string, len(list))
		for i, a := range list {
			reprs[i] = pyRepr(a)
		}
		c.repr = "[" + strings.Join(reprs, ", ") + "]"
		if c.Shell {
			c.argv = append([]string{"/bin/sh", "-c"}, list...)
		} else {
			c.argv = list
		}
	} else {
		return validationErrors{
			{Type: "string_type", Loc: []string{"body", "command", "str"}, Msg: "Input should be a valid string", Input: json.RawMessage(c.Command)},
			{Type: "list_type", Loc: []string{"body", "command", "list[str]"}, Msg: "Input should be a valid list", Input: json.RawMessage(c.Command)},
		}
	}
	if c.Timeout != nil && (*c.Timeout < 0 || *c.Timeout > maxExecSeconds) {
		return invalid("value_error", fmt.Sprintf("timeout must be between 0 and %d seconds", maxExecSeconds), *c.Timeout, "timeout")
	}
	return nil
}

// signals are the numbers Python's returncode gives as -N.
var signals = map[string]int{"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGILL": 4, "SIGTRAP": 5, "SIGABRT": 6,
	"SIGBUS": 7, "SIGFPE": 8, "SIGKILL": 9, "SIGUSR1": 10, "SIGSEGV": 11, "SIGUSR2": 12, "SIGPIPE": 13,
	"SIGALRM": 14, "SIGTERM": 15, "SIGXCPU": 24, "SIGXFSZ": 25}

// execute is LocalRuntime.execute: a command outside any session, stdin
// /dev/null, env replacing the environment when given.
func (h *Handler) execute(ctx context.Context, r *http.Request, rt *runtime, box Box) (any, error) {
	var c command
	if err := decodeBody(r, &c); err != nil {
		return nil, err
	}
	if err := c.parse(); err != nil {
		return nil, err
	}
	argv := c.argv
	if c.MergeOutputStreams {
		argv = append([]string{"/bin/sh", "-c", `exec "$@" 2>&1`, "sh"}, argv...)
	}
	if c.Env != nil {
		kv := make([]string, 0, len(c.Env))
		for k, v := range c.Env {
			if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
				return nil, invalid("value_error", fmt.Sprintf("env %q is not a valid variable", k), k, "env")
			}
			kv = append(kv, k+"="+v)
		}
		argv = append(append([]string{"env", "-i"}, kv...), argv...)
	}
	req := &api.ExecRequest{Cmd: argv, TimeoutMs: maxExecSeconds * 1000, MaxOutputBytes: maxExecOutput}
	if c.Timeout != nil {
		req.TimeoutMs = max(int64(*c.Timeout*1000), 1)
	}
	if c.Cwd != nil {
		req.Cwd = *c.Cwd
	}
	res, err := box.Exec(ctx, req)
	if err != nil {
		if errdefs.Code(err) == api.CodeInvalid {
			return nil, pyErr(excValue, "%v", err)
		}
		return nil, err
	}
	if res.TimedOut {
		t := "None"
		if c.Timeout != nil {
			t = pyFloat(*c.Timeout)
		}
		return nil, pyErr(excTimeout, "Timeout (%s) exceeded while running command", t)
	}
	code := res.ExitCode
	if n, ok := signals[res.Signal]; ok {
		code = -n
	}
	stdout, stderr := text(res.Stdout, res.Encoding), text(res.Stderr, res.Encoding)
	if c.Check && code != 0 {
		msg := fmt.Sprintf("Command %s failed with exit code %d. Stdout:\n%s\nStderr:\n%s", c.repr, code, pyRepr(stdout), pyRepr(stderr))
		if c.ErrorMsg != "" {
			msg = c.ErrorMsg + ": " + msg
		}
		return nil, &pyError{class: excNonZero, msg: msg}
	}
	return map[string]any{"stdout": stdout, "stderr": stderr, "exit_code": code}, nil
}

// text decodes an exec stream, invalid UTF-8 escaped as Python's
// backslashreplace does.
func text(s, enc string) string {
	if enc != api.EncodingBase64 {
		return s
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return s
	}
	return backslashReplace(b)
}

func backslashReplace(b []byte) string {
	var sb strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			fmt.Fprintf(&sb, `\x%02x`, b[0])
			b = b[1:]
			continue
		}
		sb.Write(b[:n])
		b = b[n:]
	}
	return sb.String()
}

// absPath places a path given by the client: relative paths are relative
// to / (where swerex-remote runs in SWE-ReX's images).
func absPath(p string) string {
	if !path.IsAbs(p) {
		p = "/" + p
	}
	return path.Clean(p)
}

func fileErr(err error, p string) error {
	switch errdefs.Code(err) {
	case api.CodeNotFound:
		return pyErr(excNotFound, "[Errno 2] No such file or directory: %s", pyRepr(p))
	case api.CodeInvalid:
		if strings.Contains(err.Error(), "directory") {
			return pyErr(excIsDir, "[Errno 21] Is a directory: %s", pyRepr(p))
		}
		return pyErr(excOS, "%s: %v", pyRepr(p), err)
	}
	return err
}

type readFileRequest struct {
	Path     *string `json:"path"`
	Encoding *string `json:"encoding"`
	Errors   *string `json:"errors"`
}

// readFile is Path.read_text: UTF-8 (or the encoding asked for, where it
// is one Go knows), universal newlines.
func (h *Handler) readFile(ctx context.Context, r *http.Request, rt *runtime, box Box) (any, error) {
	var req readFileRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	if req.Path == nil {
		return nil, missing("path")
	}
	if *req.Path == "" || strings.IndexByte(*req.Path, 0) >= 0 {
		return nil, pyErr(excNotFound, "[Errno 2] No such file or directory: %s", pyRepr(*req.Path))
	}
	data, err := box.ReadFile(ctx, absPath(*req.Path))
	if err != nil {
		return nil, fileErr(err, *req.Path)
	}
	var s string
	enc := ""
	if req.Encoding != nil {
		enc = strings.ToLower(strings.ReplaceAll(*req.Encoding, "_", "-"))
	}
	switch enc {
	case "", "utf-8", "utf8":
		if utf8.Valid(data) {
			s = string(data)
			break
		}
		errs := "strict"
		if req.Errors != nil {
			errs = *req.Errors
		}
		switch errs {
		case "replace":
			s = strings.ToValidUTF8(string(data), "\uFFFD")
		case "ignore":
			s = strings.ToValidUTF8(string(data), "")
		case "backslashreplace", "surrogateescape":
			s = backslashReplace(data)
		default:
			bad := 0
			for i := 0; i < len(data); {
				r, n := utf8.DecodeRune(data[i:])
				if r == utf8.RuneError && n <= 1 {
					bad = i
					break
				}
				i += n
			}
			return nil, pyErr(excUnicode, "'utf-8' codec can't decode byte 0x%02x in position %d: invalid start byte", data[bad], bad)
		}
	case "latin-1", "latin1", "iso-8859-1":
		rs := make([]rune, len(data))
		for i, b := range data {
			rs[i] = rune(b)
		}
		s = string(rs)
	case "ascii":
		for i, b := range data {
			if b >= 0x80 {
				return nil, pyErr(excUnicode, "'ascii' codec can't decode byte 0x%02x in position %d: ordinal not in range(128)", b, i)
			}
		}
		s = string(data)
	default:
		return nil, pyErr("builtins.LookupError", "unknown encoding: %s", *req.Encoding)
	}
	s = strings.ReplaceAll(strings.ReplaceAll(s, "\r\n", "\n"), "\r", "\n")
	return map[string]any{"content": s}, nil
}

type writeFileRequest struct {
	Content *string `json:"content"`
	Path    *string `json:"path"`
}

func (h *Handler) writeFile(ctx context.Context, r *http.Request, rt *runtime, box Box) (any, error) {
	var req writeFileRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	switch {
	case req.Content == nil:
		return nil, missing("content")
	case req.Path == nil:
		return nil, missing("path")
	case *req.Path == "" || strings.IndexByte(*req.Path, 0) >= 0:
		return nil, pyErr(excNotFound, "[Errno 2] No such file or directory: %s", pyRepr(*req.Path))
	}
	if err := box.WriteFile(ctx, absPath(*req.Path), []byte(*req.Content)); err != nil {
		return nil, fileErr(err, *req.Path)
	}
	return map[string]any{}, nil
}

// upload takes the multipart form RemoteRuntime.upload sends: file,
// target_path and unzip ("true" for a directory the client zipped).
func (h *Handler) upload(ctx context.Context, r *http.Request, rt *runtime, box Box) (any, error) {
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return nil, validationErrors{missing("file")[0], missing("target_path")[0]}
	}
	tmp, err := os.CreateTemp("", "dsec-swerex-upload-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	mr := multipart.NewReader(io.LimitReader(r.Body, h.cfg.MaxUpload+1<<20), params["boundary"])
	var target, unzip *string
	var size int64 = -1
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, invalid("value_error", "malformed multipart body: "+err.Error(), nil)
		}
		switch p.FormName() {
		case "file":
			n, err := io.Copy(tmp, io.LimitReader(p, h.cfg.MaxUpload+1))
			if err != nil {
				return nil, invalid("value_error", "read file: "+err.Error(), nil, "file")
			}
			if n > h.cfg.MaxUpload {
				return nil, fmt.Errorf("upload: over the limit of %d bytes: %w", h.cfg.MaxUpload, errdefs.ErrTooLarge)
			}
			size = n
		case "target_path", "unzip":
			b, err := io.ReadAll(io.LimitReader(p, 64<<10))
			if err != nil {
				return nil, invalid("value_error", "read form field: "+err.Error(), nil, p.FormName())
			}
			v := string(b)
			if p.FormName() == "unzip" {
				unzip = &v
			} else {
				target = &v
			}
		}
		p.Close()
	}
	var ve validationErrors
	if size < 0 {
		ve = append(ve, missing("file")...)
	}
	if target == nil {
		ve = append(ve, missing("target_path")...)
	}
	doUnzip := false
	if unzip != nil {
		switch strings.ToLower(strings.TrimSpace(*unzip)) {
		case "1", "true", "t", "yes", "y", "on":
			doUnzip = true
		case "0", "false", "f", "no", "n", "off":
		default:
			ve = append(ve, invalid("bool_parsing", "Input should be a valid boolean, unable to interpret input", *unzip, "unzip")...)
		}
	}
	if len(ve) > 0 {
		return nil, ve
	}
	if *target == "" || strings.IndexByte(*target, 0) >= 0 {
		return nil, pyErr(excNotFound, "[Errno 2] No such file or directory: %s", pyRepr(*target))
	}
	dst := absPath(*target)
	if !doUnzip {
		data, err := os.ReadFile(tmp.Name())
		if err != nil {
			return nil, err
		}
		if err := box.WriteFile(ctx, dst, data); err != nil {
			return nil, fileErr(err, *target)
		}
		return map[string]any{}, nil
	}
	zr, err := zip.NewReader(tmp, size)
	if err != nil {
		return nil, pyErr(excBadZip, "File is not a zip file")
	}
	var dirs []string
	for _, f := range zr.File {
		name := zipName(f.Name)
		if name == "" {
			continue
		}
		p := path.Join(dst, name)
		if f.FileInfo().IsDir() {
			dirs = append(dirs, p)
			continue
		}
		rc, err := f.Open()
		if err != nil {
			return nil, pyErr(excBadZip, "%s: %v", f.Name, err)
		}
		var buf bytes.Buffer
		_, err = io.Copy(&buf, io.LimitReader(rc, h.cfg.MaxUpload+1))
		rc.Close()
		if err != nil {
			return nil, pyErr(excBadZip, "%s: %v", f.Name, err)
		}
		if int64(buf.Len()) > h.cfg.MaxUpload {
			return nil, fmt.Errorf("upload: %s unpacks to over %d bytes: %w", f.Name, h.cfg.MaxUpload, errdefs.ErrTooLarge)
		}
		if err := box.WriteFile(ctx, p, buf.Bytes()); err != nil {
			return nil, fileErr(err, p)
		}
	}
	dirs = append(dirs, dst) // extractall creates the target even for an empty zip
	res, err := box.Exec(ctx, &api.ExecRequest{Cmd: append([]string{"mkdir", "-p", "--"}, dirs...), TimeoutMs: 60_000})
	if err != nil {
		return nil, err
	}
	if res.ExitCode != 0 {
		return nil, pyErr(excOS, "mkdir: %s", strings.TrimSpace(text(res.Stderr, res.Encoding)))
	}
	return map[string]any{}, nil
}

// zipName is a member's path as zipfile.extractall places it: no drive
// or leading slash, no "." or ".." components.
func zipName(name string) string {
	var parts []string
	for p := range strings.SplitSeq(strings.ReplaceAll(name, "\\", "/"), "/") {
		if p == "" || p == "." || p == ".." {
			continue
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "/")
}
