package swerex

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Python class paths of the exceptions SWE-ReX's client re-raises
// (swerex/exceptions.py and the builtins its runtime lets through).
const (
	excTimeout        = "swerex.exceptions.CommandTimeoutError"
	excNonZero        = "swerex.exceptions.NonZeroExitCodeError"
	excSyntax         = "swerex.exceptions.BashIncorrectSyntaxError"
	excNoExitCode     = "swerex.exceptions.NoExitCodeError"
	excSessionExists  = "swerex.exceptions.SessionExistsError"
	excNoSession      = "swerex.exceptions.SessionDoesNotExistError"
	excNotInitialized = "swerex.exceptions.SessionNotInitializedError"
	excPexpectTimeout = "pexpect.exceptions.TIMEOUT"
	excEOF            = "pexpect.exceptions.EOF"
	excNotFound       = "builtins.FileNotFoundError"
	excIsDir          = "builtins.IsADirectoryError"
	excUnicode        = "builtins.UnicodeDecodeError"
	excValue          = "builtins.ValueError"
	excBadZip         = "zipfile.BadZipFile"
	excOS             = "builtins.OSError"
)

// pyError is an exception of the runtime, sent as SWE-ReX's
// _ExceptionTransfer with HTTP 511.
type pyError struct {
	class, msg string
	extra      map[string]any
}

func (e *pyError) Error() string { return e.class + ": " + e.msg }

func (e *pyError) transfer() map[string]any {
	extra := e.extra
	if extra == nil {
		extra = map[string]any{}
	}
	name := e.class[strings.LastIndexByte(e.class, '.')+1:]
	return map[string]any{
		"message":    e.msg,
		"class_path": e.class,
		// There is no Python stack to show; the client only logs it.
		"traceback":  fmt.Sprintf("Traceback (most recent call last):\n  dsec swerex runtime\n%s: %s\n", name, e.msg),
		"extra_info": extra,
	}
}

func pyErr(class, format string, a ...any) *pyError {
	return &pyError{class: class, msg: fmt.Sprintf(format, a...)}
}

// validationError is one item of FastAPI's 422 detail list.
type validationError struct {
	Type  string   `json:"type"`
	Loc   []string `json:"loc"`
	Msg   string   `json:"msg"`
	Input any      `json:"input"`
}

type validationErrors []validationError

func (v validationErrors) Error() string {
	if len(v) == 0 {
		return "invalid request"
	}
	return strings.Join(v[0].Loc, ".") + ": " + v[0].Msg
}

func invalid(typ, msg string, input any, loc ...string) validationErrors {
	return validationErrors{{Type: typ, Loc: append([]string{"body"}, loc...), Msg: msg, Input: input}}
}

func missing(field string) validationErrors {
	return invalid("missing", "Field required", nil, field)
}

// decodeBody reads a JSON object body into v (pydantic's way: unknown
// fields ignored, a wrong type refused with the field's location).
func decodeBody(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return invalid("value_error", "read body: "+err.Error(), nil)
	}
	if len(b) > maxBody {
		return invalid("value_error", fmt.Sprintf("body is over %d bytes", maxBody), nil)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return missing("")[:1]
	}
	if err := json.Unmarshal(b, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			if te.Field == "" {
				return invalid("model_attributes_type", "Input should be a valid dictionary or object to extract fields from", string(b))
			}
			return invalid(te.Value+"_type", fmt.Sprintf("Input should be a valid %s", pyType(te.Type.String())), nil,
				strings.Split(te.Field, ".")...)
		}
		return validationErrors{{Type: "json_invalid", Loc: []string{"body", "0"}, Msg: "JSON decode error", Input: map[string]any{}}}
	}
	return nil
}

func pyType(goType string) string {
	switch strings.TrimPrefix(goType, "*") {
	case "string":
		return "string"
	case "float64":
		return "number"
	case "int":
		return "integer"
	case "bool":
		return "boolean"
	default:
		if strings.HasPrefix(goType, "[]") {
			return "list"
		}
		return "dictionary"
	}
}

// pyRepr is Python's repr of a str.
func pyRepr(s string) string {
	q := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == utf8.RuneError, r < 0x20, r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r&0xff)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
	return b.String()
}

// pyFloat is Python's str of a float (25.0, 0.5, 1e-05).
func pyFloat(f float64) string {
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eEnN") {
		s += ".0"
	}
	return s
}
