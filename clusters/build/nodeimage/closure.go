package nodeimage

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"lampyr.dev/serving/impl/build/image"
)

// ParseDepends turns a dpkg Depends/Pre-Depends field into the package names
// to follow: the first alternative of each group, without versions or
// architecture qualifiers.
func ParseDepends(field string) []string {
	var out []string
	for _, group := range strings.Split(field, ",") {
		first := strings.TrimSpace(strings.Split(group, "|")[0])
		if first == "" {
			continue
		}
		name := strings.Fields(first)[0]
		name, _, _ = strings.Cut(name, ":")
		out = append(out, name)
	}
	return out
}

// usrMerged are the top-level directories Debian's usrmerge turns into
// symlinks to /usr; files listed under them live under /usr.
var usrMerged = []string{"bin", "sbin", "lib", "lib64"}

// CanonicalPath maps a dpkg-listed path to where the file is on a usrmerged
// root.
func CanonicalPath(p string, merged map[string]bool) string {
	for _, d := range usrMerged {
		if merged[d] && (p == "/"+d || strings.HasPrefix(p, "/"+d+"/")) {
			return "/usr" + p
		}
	}
	return p
}

// PackageClosure returns pkgs and everything they depend on, as installed in
// root, sorted.
func PackageClosure(ctx context.Context, root string, pkgs []string) ([]string, error) {
	seen := map[string]bool{}
	queue := append([]string(nil), pkgs...)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if seen[p] {
			continue
		}
		out, err := exec.CommandContext(ctx, "chroot", root, "dpkg-query", "-W", "-f=${Status}\t${Depends},${Pre-Depends}", p).Output()
		if err != nil || !strings.HasPrefix(string(out), "install ok installed") {
			// A virtual package or an alternative not installed: nothing to copy.
			continue
		}
		seen[p] = true
		_, deps, _ := strings.Cut(string(out), "\t")
		queue = append(queue, ParseDepends(deps)...)
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// ClosureFiles collects, from root, the files of pkgs' closure plus the
// alternatives symlinks that make their commands callable, as layer entries.
func ClosureFiles(ctx context.Context, root string, pkgs []string) ([]image.File, []string, error) {
	closure, err := PackageClosure(ctx, root, pkgs)
	if err != nil {
		return nil, nil, err
	}
	merged := map[string]bool{}
	var files []image.File
	for _, d := range usrMerged {
		if target, err := os.Readlink(filepath.Join(root, d)); err == nil {
			merged[d] = true
			files = append(files, image.File{Path: "/" + d, Symlink: target})
		}
	}
	seen := map[string]bool{}
	add := func(p string) error {
		p = CanonicalPath(p, merged)
		if seen[p] {
			return nil
		}
		seen[p] = true
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			return nil // listed by dpkg but removed (docs we trimmed)
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(filepath.Join(root, p))
			if err != nil {
				return err
			}
			files = append(files, image.File{Path: p, Symlink: t})
		case fi.IsDir():
			files = append(files, image.File{Path: p, Dir: true, Mode: int64(fi.Mode().Perm())})
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(filepath.Join(root, p))
			if err != nil {
				return err
			}
			files = append(files, image.File{Path: p, Mode: int64(fi.Mode().Perm()), Body: b})
		}
		return nil
	}
	for _, pkg := range closure {
		list, err := os.ReadFile(filepath.Join(root, "var/lib/dpkg/info", pkg+".list"))
		if err != nil {
			if list, err = os.ReadFile(filepath.Join(root, "var/lib/dpkg/info", pkg+":amd64.list")); err != nil {
				return nil, nil, fmt.Errorf("dpkg file list of %s: %w", pkg, err)
			}
		}
		for _, p := range strings.Split(strings.TrimSpace(string(list)), "\n") {
			if p == "/." || p == "" {
				continue
			}
			if err := add(p); err != nil {
				return nil, nil, err
			}
		}
	}
	// update-alternatives links (e.g. /usr/sbin/iptables -> /etc/alternatives/iptables)
	// are made by maintainer scripts, not listed by dpkg.
	for _, dir := range []string{"/etc/alternatives", "/usr/sbin", "/usr/bin"} {
		entries, _ := os.ReadDir(filepath.Join(root, dir))
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			t, err := os.Readlink(filepath.Join(root, p))
			if err != nil {
				continue
			}
			if dir == "/etc/alternatives" || strings.HasPrefix(t, "/etc/alternatives/") {
				if !seen[p] {
					seen[p] = true
					files = append(files, image.File{Path: p, Symlink: t})
				}
			}
		}
	}
	return files, closure, nil
}
