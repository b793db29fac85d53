package microvm

import (
	"context"
	"fmt"
	"net"
	"path/filepath"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// pushFiles hands the guest's agent the file rules of the current phase
// (the agent enforces them with Landlock, which the guest kernel has).
func (b *Backend) pushFiles(ctx context.Context, v *vm) error {
	if v.Spec.Files.Deny == nil && v.Spec.Files.ReadOnly == nil {
		return nil
	}
	return b.setAgentPolicy(ctx, v, v.Spec.Phase, v.Spec.Files)
}

func (b *Backend) setAgentPolicy(ctx context.Context, v *vm, phase string, f api.FileRules) error {
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return v.link.dial(ctx) })
	defer c.Close()
	err := c.SetPolicy(ctx, &agent.Policy{Phase: phase, Files: agent.FileRules{Deny: f.Deny, ReadOnly: f.ReadOnly}})
	if err != nil {
		return fmt.Errorf("sandbox %s: file rules: %w", v.Spec.ID, err)
	}
	return nil
}

// SetPhase implements backend.Phaser: the guest's agent gets the new file
// rules. A microVM has no network device, so every phase's network is
// none.
func (b *Backend) SetPhase(ctx context.Context, id string, p backend.Policy) error {
	v, err := b.get(id)
	if err != nil {
		return err
	}
	if p.Network.Mode != "" && p.Network.Mode != api.NetworkNone {
		return errdefs.Invalid("sandbox %s is a microVM without a network interface: no phase of it may use network mode %s", id, p.Network.Mode)
	}
	if err := b.setAgentPolicy(ctx, v, p.Phase, p.Files); err != nil {
		return err
	}
	v.Spec.Phase, v.Spec.Network, v.Spec.Files = p.Phase, p.Network, p.Files
	return backend.WriteJSONFile(filepath.Join(v.Machine.Dir, "vm.json"), v.record())
}
