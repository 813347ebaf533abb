package nodeimage

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// RootfsSpec says how to make the node's Debian root filesystem.
type RootfsSpec struct {
	Suite    string
	Mirror   string
	Packages []string
	// KindFiles is kind's images/base/files directory (from the kind module).
	KindFiles string
}

// BuildRootfs debootstraps spec into dir (which must not exist) and applies
// what kind's base Dockerfile does: its files, the systemd trimming, the
// enabled units, and the containerd base runtime spec.
func BuildRootfs(ctx context.Context, spec RootfsSpec, dir string, log io.Writer) error {
	tmp := dir + ".partial"
	if err := removeTree(tmp); err != nil {
		return err
	}
	args := []string{"--variant=minbase", "--include=" + strings.Join(spec.Packages, ","), spec.Suite, tmp, spec.Mirror}
	// Mirrors fail transiently ("Couldn't download ... Packages" was seen
	// here); retry a few times from a clean tree before giving up.
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		if err = run(ctx, log, "debootstrap", args...); err == nil || ctx.Err() != nil {
			break
		}
		fmt.Fprintf(log, "debootstrap attempt %d failed: %v; retrying\n", attempt, err)
		if rerr := removeTree(tmp); rerr != nil {
			return rerr
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(attempt) * 5 * time.Second):
		}
	}
	if err != nil {
		return fmt.Errorf("debootstrap %s (needs root and the Debian mirror %s; set LAMPYR_DEBIAN_MIRROR for another): %w", spec.Suite, spec.Mirror, err)
	}
	if err := copyKindFiles(spec.KindFiles, tmp); err != nil {
		return fmt.Errorf("copy kind base files: %w", err)
	}
	steps := []string{
		// kind's unit runs /usr/local/bin/containerd; Debian installs /usr/bin/containerd.
		"ln -sf /usr/bin/containerd /usr/local/bin/containerd",
		"ln -sf /usr/bin/ctr /usr/local/bin/ctr",
		"ln -sf /usr/bin/containerd-shim-runc-v2 /usr/local/bin/containerd-shim-runc-v2",
		// Debian puts CNI plugins under /usr/lib/cni; containerd looks in /opt/cni/bin.
		"mkdir -p /opt/cni/bin && for p in /usr/lib/cni/*; do ln -sf $p /opt/cni/bin/; done",
		// kind's base image: generated runtime spec with the product-uuid hook, no rlimits.
		`ctr oci spec | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json`,
		"find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete",
		"rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* /lib/systemd/system/local-fs.target.wants/*",
		"rm -f /lib/systemd/system/sockets.target.wants/*udev* /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*",
		"echo ReadKMsg=no >> /etc/systemd/journald.conf",
		"ln -sf /usr/lib/systemd/systemd /sbin/init",
		"systemctl enable kubelet.service containerd.service undo-mount-hacks.service",
		"systemctl mask systemd-binfmt.service",
		"mkdir -p /etc/kubernetes/manifests /etc/containerd/certs.d /kind/images /kind/manifests",
		// Smaller image: nothing here is read on a node.
		"rm -rf /usr/share/doc/* /usr/share/man/* /usr/share/info/* /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb /var/log/*.log",
		"find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'en*' -exec rm -rf {} +",
	}
	for _, s := range steps {
		if err := run(ctx, log, "chroot", tmp, "/bin/bash", "-ec", s); err != nil {
			return fmt.Errorf("configure rootfs (%s): %w", s, err)
		}
	}
	return os.Rename(tmp, dir)
}

// removeTree deletes a (partial) rootfs. An interrupted debootstrap leaves
// /proc and /sys mounted inside it; those are unmounted first (deepest
// first) so nothing outside the tree is touched.
func removeTree(dir string) error {
	if _, err := os.Stat(dir); err != nil {
		return nil
	}
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var mounts []string
	for _, line := range strings.Split(string(info), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			mounts = append(mounts, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s left by an interrupted debootstrap: %w", m, err)
		}
	}
	return os.RemoveAll(dir)
}

// copyKindFiles installs kind's base files with the modes its Dockerfile
// gives them.
func copyKindFiles(src, root string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if rel == "." || strings.HasPrefix(rel, "LICENSES") {
			return nil
		}
		dst := filepath.Join(root, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		mode := fs.FileMode(0o644)
		if strings.HasPrefix(rel, "usr/local/bin/") || strings.HasPrefix(rel, "kind/bin/") {
			mode = 0o755
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, mode)
	})
}

// TarDir writes dir as a tar (numeric owners, xattrs kept, /dev, /proc and
// /sys contents excluded) for use as an image layer.
func TarDir(ctx context.Context, dir, out string) error {
	tmp := out + ".tmp"
	args := []string{"--numeric-owner", "--xattrs", "--xattrs-include=*", "-C", dir,
		"--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*", "--exclude=./run/*", "--exclude=./tmp/*",
		"-cf", tmp, "."}
	if err := run(ctx, io.Discard, "tar", args...); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

func run(ctx context.Context, log io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	// debootstrap and go start children; on cancel (Ctrl-C) kill the whole
	// process group so nothing keeps writing into the cache.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	err := cmd.Run()
	if log != nil && out.Len() > 0 && err != nil {
		msg := out.String()
		if len(msg) > 3000 {
			msg = "..." + msg[len(msg)-3000:]
		}
		fmt.Fprint(log, msg)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
