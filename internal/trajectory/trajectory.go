// Package trajectory is the logic of the trajectory log: what identifies a
// command (its fingerprint), which trajectory keys and execs are valid, and
// what to do with a step given its record — replay it, run it, or wait
// for the run in flight. It holds no state and does no I/O: the server
// runs steps and the store keeps them. It must never answer Replay for a
// step whose effects are not in the sandbox asking, since that would
// silently skip a command the sandbox never saw.
package trajectory

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

// Limits of a trajectory exec.
const (
	// MaxOutputBytes caps each recorded stream: the log keeps every
	// result, so it keeps them small.
	MaxOutputBytes = 1 << 20
	// MaxStep is the largest step number (exact in a float64, for
	// clients that parse JSON numbers as doubles).
	MaxStep = 1<<53 - 1
	// CheckpointsOff as a step's checkpoint_every stops the trajectory's
	// checkpoints (0 keeps its setting).
	CheckpointsOff = -1
)

var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,255}$`)

// ValidID checks a trajectory id.
func ValidID(id string) error {
	if !idRE.MatchString(id) {
		return errdefs.Invalid("trajectory id %q: want 1 to 256 of [A-Za-z0-9._:@/+=-], starting with a letter or digit", id)
	}
	return nil
}

// CheckExec validates an exec request that carries a trajectory.
func CheckExec(req *api.ExecRequest) error {
	t := req.Trajectory
	if err := ValidID(t.ID); err != nil {
		return err
	}
	switch {
	case t.Step < 0 || t.Step > MaxStep:
		return errdefs.Invalid("trajectory step %d: want 0 to %d", t.Step, int64(MaxStep))
	case t.CheckpointEvery < CheckpointsOff || t.CheckpointEvery > MaxStep:
		return errdefs.Invalid("trajectory checkpoint_every %d: want 1 to %d steps, 0 to keep the trajectory's setting, or -1 to stop checkpoints", t.CheckpointEvery, int64(MaxStep))
	case req.Background:
		return errdefs.Invalid("a background exec has no result to record: drop background or trajectory")
	case req.Tag != "":
		return errdefs.Invalid("tag is only for background execs")
	case req.MaxOutputBytes > MaxOutputBytes:
		return errdefs.Invalid("with a trajectory, max_output_bytes is at most %d", MaxOutputBytes)
	}
	return nil
}

// Fingerprint identifies what a command runs: its argv (a shell string
// counts as /bin/sh -c), its env, its cwd ("" is "/") and its stdin bytes
// (however they were encoded). Limits — timeout_ms, max_output_bytes — are
// not part of it: a replay that changes them is the same command.
func Fingerprint(req *api.ExecRequest) (string, error) {
	c := struct {
		Argv  []string          `json:"argv"`
		Env   map[string]string `json:"env,omitempty"`
		Cwd   string            `json:"cwd"`
		Stdin []byte            `json:"stdin,omitempty"`
	}{Argv: req.Cmd, Env: req.Env, Cwd: req.Cwd}
	if req.Shell != "" {
		c.Argv = []string{"/bin/sh", "-c", req.Shell}
	}
	if c.Cwd == "" {
		c.Cwd = "/"
	}
	switch req.StdinEncoding {
	case api.EncodingUTF8:
		c.Stdin = []byte(req.Stdin)
	case api.EncodingBase64:
		b, err := base64.StdEncoding.DecodeString(req.Stdin)
		if err != nil {
			return "", errdefs.Invalid("stdin is not base64: %v", err)
		}
		c.Stdin = b
	default:
		return "", errdefs.Invalid("stdin_encoding %q is not \"\" or \"base64\"", req.StdinEncoding)
	}
	b, err := json.Marshal(c) // map keys come out sorted
	if err != nil {
		return "", fmt.Errorf("fingerprint: %w", err)
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// Place is where a step runs: a sandbox in one generation (between two
// resets).
type Place struct {
	Sandbox    string
	Generation int64
}

// Action is what to do with a step.
type Action int

const (
	// Run: there is no record of the step; run it and record it.
	Run Action = iota
	// Replay: the same command ran here; answer with its recorded result.
	Replay
	// Diverge: another command was recorded at this step; the log from
	// here on is dropped, then the command runs.
	Diverge
	// Rerun: the same command was recorded, but its effects are not in
	// this sandbox (it ran in another sandbox, or before a reset); run it
	// again here to rebuild the state, and record the new result.
	Rerun
	// Settle: the step is recorded as running; wait for its outcome (or
	// find it in the sandbox after a crash), then decide again.
	Settle
)

func (a Action) String() string {
	return [...]string{"run", "replay", "diverge", "rerun", "settle"}[a]
}

// Decide says what to do with a step running fingerprint fp at here,
// given its record (nil if there is none).
func Decide(rec *store.Step, fp string, here Place) Action {
	switch {
	case rec == nil:
		return Run
	case rec.State != api.StepDone:
		return Settle
	case rec.Fingerprint != fp:
		return Diverge
	case rec.Sandbox != here.Sandbox || rec.Generation != here.Generation:
		return Rerun
	}
	return Replay
}
