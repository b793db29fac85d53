package initramfs

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ulikunitz/xz"
)

// Kernel is a guest kernel unpacked from a Debian linux-image package:
// <dir>/boot/vmlinuz-<version> and <dir>/lib/modules/<version>/.
type Kernel struct {
	Version string
	Image   string // the bzImage
	Modules string // lib/modules/<version>
}

// FindKernel finds the one kernel unpacked under dir.
func FindKernel(dir string) (Kernel, error) {
	images, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	if len(images) != 1 {
		return Kernel{}, fmt.Errorf("guest kernel in %s: want one boot/vmlinuz-*, found %d", dir, len(images))
	}
	v := strings.TrimPrefix(filepath.Base(images[0]), "vmlinuz-")
	k := Kernel{Version: v, Image: images[0], Modules: filepath.Join(dir, "lib", "modules", v)}
	if _, err := os.Stat(k.Modules); err != nil {
		return Kernel{}, fmt.Errorf("guest kernel %s: modules: %w", v, err)
	}
	return k, nil
}

// Module is a loadable module of the kernel.
type Module struct {
	Name string
	Path string // .ko, .ko.xz
}

// ResolveModules returns the modules named (and every module they depend
// on) in load order: dependencies first. Modules built into the kernel
// are left out; a name that is neither built in nor a module is an error.
func (k Kernel) ResolveModules(names []string) ([]Module, error) {
	index, err := k.index()
	if err != nil {
		return nil, err
	}
	builtin := k.builtin()
	var (
		order []Module
		state = map[string]int{} // 1: visiting, 2: done
	)
	var visit func(name, from string) error
	visit = func(name, from string) error {
		name = modName(name)
		switch state[name] {
		case 1:
			return fmt.Errorf("module %s: dependency cycle", name)
		case 2:
			return nil
		}
		p, ok := index[name]
		if !ok {
			if builtin[name] {
				state[name] = 2
				return nil
			}
			if from != "" {
				return fmt.Errorf("module %s (needed by %s) not found in %s", name, from, k.Modules)
			}
			return fmt.Errorf("module %s not found in %s", name, k.Modules)
		}
		state[name] = 1
		deps, err := moduleDepends(p)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, Module{Name: name, Path: p})
		return nil
	}
	for _, n := range names {
		if err := visit(n, ""); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// modName is a module's canonical name: the kernel treats - and _ alike.
func modName(s string) string { return strings.ReplaceAll(s, "-", "_") }

func (k Kernel) index() (map[string]string, error) {
	index := map[string]string{}
	err := filepath.WalkDir(filepath.Join(k.Modules, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		base := d.Name()
		for _, ext := range []string{".ko", ".ko.xz"} {
			if strings.HasSuffix(base, ext) {
				index[modName(strings.TrimSuffix(base, ext))] = p
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("index modules of %s: %w", k.Version, err)
	}
	return index, nil
}

// builtin reads modules.builtin: the modules compiled into the kernel.
func (k Kernel) builtin() map[string]bool {
	out := map[string]bool{}
	f, err := os.Open(filepath.Join(k.Modules, "modules.builtin"))
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out[modName(strings.TrimSuffix(filepath.Base(sc.Text()), ".ko"))] = true
	}
	return out
}

// ReadModule returns a module's ELF object, decompressed.
func ReadModule(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".xz") {
		if r, err = xz.NewReader(bufio.NewReader(f)); err != nil {
			return nil, fmt.Errorf("module %s: %w", path, err)
		}
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", path, err)
	}
	return b, nil
}

// moduleDepends reads the depends= field of a module's .modinfo section.
func moduleDepends(path string) ([]string, error) {
	b, err := ReadModule(path)
	if err != nil {
		return nil, err
	}
	ef, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", path, err)
	}
	sec := ef.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("module %s: no .modinfo section", path)
	}
	info, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", path, err)
	}
	for _, kv := range bytes.Split(info, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			if len(v) == 0 {
				return nil, nil
			}
			deps := strings.Split(string(v), ",")
			return slices.DeleteFunc(deps, func(s string) bool { return s == "" }), nil
		}
	}
	return nil, nil // a module without the field depends on nothing
}
