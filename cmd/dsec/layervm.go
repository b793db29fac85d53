package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/image"
	"github.com/dsec-project/dsec/internal/vmimage"
)

// vmDefaultPackages make a Debian tree bootable as a full VM: a kernel,
// systemd as init, udev, and ps for the commands of a sandbox.
var vmDefaultPackages = []string{"systemd", "systemd-sysv", "udev", "procps"}

// vmFlags are `dsec layer build --vm`'s: a bootable disk image (a vm
// layer) from a debootstrapped Debian.
type vmFlags struct {
	vm        bool
	kernel    string
	output    string
	autologin bool
	sizeMB    int64
	agent     string
}

func (v *vmFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&v.vm, "vm", false, "build a vm layer (a bootable disk image for the fullvm backend) from --debootstrap: kernel, systemd, dsec-agent as a unit")
	fs.StringVar(&v.kernel, "vm-kernel", "linux-image-cloud-amd64", "with --vm: the kernel package")
	fs.StringVar(&v.output, "output", "", "with --vm: write the qcow2 image to this file instead of uploading it")
	fs.BoolVar(&v.autologin, "autologin", true, "with --vm: log root in on the screen's console")
	fs.Int64Var(&v.sizeMB, "disk-mb", 0, "with --vm: the disk's size (default: the tree plus room)")
	fs.StringVar(&v.agent, "agent", "", "with --vm: the dsec-agent binary to install (default: next to dsec)")
}

// build debootstraps the tree, makes it a disk image and uploads it (or
// writes it to --output).
func (v *vmFlags) build(ctx context.Context, src *layerSource, pos []string, newClient func() *client.Client, name string, public bool) error {
	if (src.debootstrap == "") == (len(pos) == 0) || len(pos) > 1 {
		return errors.New("--vm needs --debootstrap SUITE or a root tree DIR with a kernel and systemd, which it changes " +
			"(or upload a finished disk image: dsec layer import --kind vm --name N FILE)")
	}
	if os.Geteuid() != 0 {
		return errors.New("building a vm image keeps owners and device nodes: run as root")
	}
	if v.output == "" && name == "" {
		return errors.New("usage: dsec layer build --vm --debootstrap SUITE (--name NAME:TAG | --output FILE)")
	}
	agent := v.agent
	if agent == "" {
		var n nodeFlags
		p, err := n.agentBinary()
		if err != nil {
			return err
		}
		agent = p
	}
	t0 := time.Now()
	var dir string
	if len(pos) == 1 {
		dir = pos[0]
	} else {
		tmp, err := os.MkdirTemp("", "dsec-vm-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
		include := append(append([]string{}, vmDefaultPackages...), v.kernel)
		if src.include != "" {
			include = append(include, strings.Split(src.include, ",")...)
		}
		fmt.Fprintf(os.Stderr, "debootstrap %s (+%s) from %s\n", src.debootstrap, strings.Join(include, ","), src.mirror)
		if err := image.Debootstrap(ctx, src.debootstrap, include, src.mirror, dir); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "debootstrap done in %s\n", time.Since(t0).Round(time.Second))
	}
	out := v.output
	if out == "" {
		f, err := os.CreateTemp("", "dsec-vm-*.qcow2")
		if err != nil {
			return err
		}
		f.Close()
		out = f.Name()
		defer os.Remove(out)
	}
	if err := vmimage.Build(ctx, vmimage.Options{Tree: dir, Agent: agent, Out: out, SizeMB: v.sizeMB, Autologin: v.autologin}); err != nil {
		return err
	}
	st, err := os.Stat(out)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "vm image %s: %s in %s\n", out, humanBytes(st.Size()), time.Since(t0).Round(time.Second))
	if v.output != "" {
		return nil
	}
	return layerBuild(ctx, newClient(), api.KindVM, name, out, public)
}
