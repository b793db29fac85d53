package microvm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dsec-project/dsec/internal/backend"
)

// Recover implements backend.Backend. After an edge restart it:
//   - removes sandboxes whose create never finished (no vm.json), killing
//     a VMM that such a create had started,
//   - adopts VMs whose VMM process still runs,
//   - boots again, over their kept writable disk, VMs whose process died,
//   - kills VMM processes of this backend that belong to no sandbox kept
//     (one a killed create had started before it wrote its pid file),
//   - removes initramfs images no VM boots from.
func (b *Backend) Recover(ctx context.Context) ([]backend.Spec, error) {
	entries, err := os.ReadDir(filepath.Join(b.cfg.Root, "vms"))
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	var (
		specs  []backend.Spec
		known  = map[string]bool{}
		images = map[string]bool{b.initrd: true}
	)
	for _, e := range entries {
		id := e.Name()
		v, err := readVM(filepath.Join(b.dir(id), "vm.json"))
		if err != nil {
			b.log.InfoContext(ctx, "recover: removing unfinished sandbox", "sandbox", id, "reason", err)
			if err := b.teardown(ctx, id, nil); err != nil {
				b.log.WarnContext(ctx, "recover: cleanup failed", "sandbox", id, "err", err)
			}
			continue
		}
		v.link = newLink(&v.Machine, b.cfg.Link)
		dropForkLeftovers(v)
		if v.Hibernated {
			// Its memory is on disk: it stays so until a resume. A VMM
			// still running (the edge died as it hibernated it) saved
			// the state already.
			b.cfg.VMM.Stop(ctx, &v.Machine, v.Process)
			v.Process = Process{}
			b.removeCgroup(id)
			v.link.paused.Store(true)
		} else if !v.proc().Alive() {
			b.removeCgroup(id)
			if v.Machine.Type == TypeQ35 {
				if _, err := os.Stat(v.Machine.Kernel); err != nil {
					m, err := b.fullMachine(ctx, v.Spec) // its kernel was pruned: copy it out again
					if err == nil {
						v.Machine.Kernel, v.Machine.Initrd = m.Kernel, m.Initrd
					}
				}
			} else if _, err := os.Stat(v.Machine.Initrd); err != nil {
				v.Machine.Initrd = b.initrd // its image is gone: boot the current one
			}
			if err := b.repair(ctx, v); err != nil {
				b.log.ErrorContext(ctx, "recover: cannot boot sandbox again; removing it", "sandbox", id, "err", err)
				b.teardown(ctx, id, v)
				continue
			}
			b.log.InfoContext(ctx, "recover: booted again a sandbox whose VM had stopped", "sandbox", id)
		}
		if st, err := b.cfg.VMM.Status(ctx, &v.Machine, v.proc()); err == nil && st == StatusPaused {
			v.link.paused.Store(true)
		}
		images[v.Machine.Initrd] = true
		if v.Machine.Type == TypeQ35 {
			images[filepath.Dir(v.Machine.Kernel)] = true
		}
		known[id] = true
		b.mu.Lock()
		b.vms[id] = v
		b.mu.Unlock()
		specs = append(specs, v.Spec)
	}
	b.killOrphans(ctx, known)
	pruneImages(filepath.Join(b.cfg.Root, "images"), images)
	return specs, nil
}

// repair boots a VM whose process is gone, keeping its writable disk.
func (b *Backend) repair(ctx context.Context, v *vm) error {
	if err := layersPresent(v.Spec); err != nil {
		return err
	}
	disk := "rw.img"
	if v.Machine.Type == TypeQ35 {
		disk = overlayFile
	}
	if _, err := os.Stat(filepath.Join(v.Machine.Dir, disk)); err != nil {
		return fmt.Errorf("writable disk: %w", err)
	}
	return b.boot(ctx, v, false)
}

func readVM(path string) (*vm, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r vmRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	if r.Spec.ID == "" || r.Machine.Dir == "" {
		return nil, errors.New("incomplete sandbox record")
	}
	return &vm{Spec: r.Spec, Machine: r.Machine, Process: r.Process, Hibernated: r.Hibernated}, nil
}

// vmmFromPidFile finds the VMM process that wrote dir's pid file, if it
// still runs and is the VMM of that directory (its command line names
// the pid file).
func vmmFromPidFile(dir string) (Process, bool) {
	pidFile := filepath.Join(dir, PidFile)
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return Process{}, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || !cmdlineHas(pid, pidFile) {
		return Process{}, false
	}
	p, err := ProcessOf(pid)
	return p, err == nil
}

func cmdlineHas(pid int, arg string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	for _, a := range bytes.Split(b, []byte{0}) {
		if string(a) == arg {
			return true
		}
	}
	return false
}

// killOrphans kills VMM processes whose pid file lies in this backend's
// vms directory but that belong to no sandbox in known.
func (b *Backend) killOrphans(ctx context.Context, known map[string]bool) {
	prefix := filepath.Join(b.cfg.Root, "vms") + "/"
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		for _, a := range bytes.Split(cmd, []byte{0}) {
			s := string(a)
			if !strings.HasPrefix(s, prefix) || !strings.HasSuffix(s, "/"+PidFile) {
				continue
			}
			id := strings.TrimSuffix(strings.TrimPrefix(s, prefix), "/"+PidFile)
			if known[id] || strings.Contains(id, "/") {
				continue
			}
			if p, err := ProcessOf(pid); err == nil {
				b.log.InfoContext(ctx, "recover: killing orphan VM", "sandbox", id, "pid", pid)
				p.Kill(ctx)
				b.removeCgroup(id)
			}
		}
	}
}

// cidFor derives a guest's vsock context id from its sandbox id. CIDs 0-2
// are reserved; a clash makes the VMM refuse to start, and the create
// fails rather than reaching another guest.
func cidFor(id string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(id))
	return 3 + h.Sum32()%(1<<31)
}

// dropForkLeftovers removes what a fork or a hibernation that the edge's
// death interrupted left in a sandbox's directory.
func dropForkLeftovers(v *vm) {
	left, _ := filepath.Glob(filepath.Join(v.Machine.Dir, forkDirPrefix+"*"))
	for _, d := range left {
		os.RemoveAll(d)
	}
	os.Remove(filepath.Join(v.Machine.Dir, memoryFile+".tmp"))
	if !v.Hibernated {
		os.Remove(filepath.Join(v.Machine.Dir, memoryFile))
	}
}
