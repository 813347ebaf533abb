package ly

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
)

// ImageSnapshotOptions tune SnapshotImage.
type ImageSnapshotOptions struct {
	// Repository receives the snapshot artifact, tagged like the image;
	// default: the image's registry, lampyr/snapshots/<image repo base>.
	Repository string
	// Port the image's server listens on ($PORT); default 8080.
	Port int32
	// Protocol is http1 (default) or h2c.
	Protocol string
	// Remote are go-containerregistry options for pulling and pushing.
	Remote []remote.Option
	// Limits bound unpacking the image (zero fields: artifact.DefaultLimits,
	// which fiberd applies to the snapshot too, so a tree within them makes
	// a snapshot fiberd accepts).
	Limits artifact.Limits
}

// ImageSnapshot is a runnable image and the snapshot artifact made from it.
type ImageSnapshot struct {
	Image    string          `json:"image"`
	Snapshot string          `json:"snapshot"`
	Config   artifact.Config `json:"config"`
	// Dropped lists image entries a snapshot cannot hold (device nodes,
	// FIFOs), which the fiber sandbox would not give the handler anyway.
	Dropped []string `json:"dropped,omitempty"`
}

// SnapshotImage makes a Lampyr snapshot artifact from a runnable image: the
// image's flattened file system and its entrypoint, with the port and
// protocol the server speaks. The image must be digest-pinned, so the
// mapping it is registered under names exactly these bytes. A fiber runs
// the entrypoint as the image's non-root USER (65534 if it has none or is
// root) inside the fiber's own user namespace, with a read-only root, a
// private /tmp and only the runtime contract's environment; an image that
// needs more (its own ENV, a writable root, root) does not behave the same
// in a fiber.
func SnapshotImage(ctx context.Context, image string, o ImageSnapshotOptions) (*ImageSnapshot, error) {
	ref, err := name.NewDigest(image)
	if err != nil {
		return nil, fmt.Errorf("image %q: pin it by digest (repository@sha256:...), so the mapping names exactly what runs: %w", image, err)
	}
	if o.Port == 0 {
		o.Port = 8080
	}
	switch o.Protocol {
	case "":
		o.Protocol = "http1"
	case "http1", "h2c":
	default:
		return nil, fmt.Errorf("protocol %q: want http1 or h2c", o.Protocol)
	}
	if o.Repository == "" {
		o.Repository = ref.Context().RegistryStr() + "/lampyr/snapshots/" + path.Base(ref.Context().RepositoryStr())
	}
	repo, err := name.NewRepository(o.Repository)
	if err != nil {
		return nil, fmt.Errorf("snapshot repository %q: %w", o.Repository, err)
	}
	opts := append([]remote.Option{remote.WithContext(ctx)}, o.Remote...)
	img, err := remote.Image(ref, opts...)
	if err != nil {
		return nil, registryErr(ref.RegistryStr(), "pulling "+image, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%s: image config: %w", image, err)
	}
	stage, err := os.MkdirTemp("", "ly-image-snapshot-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stage)
	root := filepath.Join(stage, "root")
	dropped, err := unpackImage(img, root, o.Limits)
	if err != nil {
		return nil, fmt.Errorf("%s: unpacking its file system: %w", image, err)
	}
	entry := append(append([]string{}, cf.Config.Entrypoint...), cf.Config.Cmd...)
	if len(entry) == 0 {
		return nil, fmt.Errorf("%s has neither ENTRYPOINT nor CMD: nothing to run", image)
	}
	if entry[0], err = lookPath(root, entry[0], cf.Config.Env); err != nil {
		return nil, fmt.Errorf("%s: %w", image, err)
	}
	cfg := artifact.Config{
		Entrypoint:    entry,
		Port:          o.Port,
		Protocol:      o.Protocol,
		Runtime:       artifact.Runtime{Name: "oci-image", Version: ref.DigestStr()},
		HelperVersion: artifact.HelperProtocolVersion,
		User:          imageUser(root, cf.Config.User),
	}
	snap, err := artifact.Build(root, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: building the snapshot artifact: %w", image, err)
	}
	tag := strings.TrimPrefix(ref.DigestStr(), "sha256:")[:16]
	pushed, err := artifact.Push(ctx, snap, repo.Tag(tag).String(), o.Remote...)
	if err != nil {
		return nil, registryErr(repo.RegistryStr(), "pushing the snapshot artifact to "+repo.String(), err)
	}
	raw, err := snap.RawConfigFile()
	if err != nil {
		return nil, err
	}
	var got artifact.Config
	if err := json.Unmarshal(raw, &got); err != nil {
		return nil, err
	}
	return &ImageSnapshot{Image: ref.String(), Snapshot: pushed.String(), Config: got, Dropped: dropped}, nil
}

// imageUser is the image's USER as the snapshot's numeric "uid:gid" (names
// resolved through the image's own /etc/passwd and /etc/group), or "" (the
// fiber's default, 65534) for root, an unset user, or one a fiber's user
// namespace cannot map (65536 and above, unknown names).
func imageUser(root, user string) string {
	if user == "" {
		return ""
	}
	u, g, hasG := strings.Cut(user, ":")
	lookup := func(file, name string, field int) (string, bool) {
		if _, err := strconv.ParseUint(name, 10, 32); err == nil {
			return name, true
		}
		b, err := os.ReadFile(filepath.Join(root, "etc", file))
		if err != nil {
			return "", false
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Split(line, ":")
			if len(f) > field && f[0] == name {
				return f[field], true
			}
		}
		return "", false
	}
	uid, ok := lookup("passwd", u, 2)
	if !ok {
		return ""
	}
	gid := uid
	if hasG {
		if gid, ok = lookup("group", g, 2); !ok {
			return ""
		}
	} else if b, err := os.ReadFile(filepath.Join(root, "etc", "passwd")); err == nil {
		// The user's primary group, as a container runtime would use.
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Split(line, ":"); len(f) > 3 && (f[0] == u || f[2] == u) {
				gid = f[3]
				break
			}
		}
	}
	c := artifact.Config{User: uid + ":" + gid}
	if _, _, err := c.UserIDs(); err != nil {
		return ""
	}
	return c.User
}

// unpackImage writes the image's file system under root with the one
// hardened unpacker fiberd uses too (artifact.UnpackLayers): layers in
// order with OCI whiteouts, nothing written at or below a symlink, one
// entry per path and layer, hard links only to files inside the tree,
// within l. Device nodes and FIFOs are dropped and listed.
func unpackImage(img v1.Image, root string, l artifact.Limits) ([]string, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	open := make([]artifact.LayerOpener, len(layers))
	for i, layer := range layers {
		open[i] = func() (io.ReadCloser, error) {
			rc, err := layer.Uncompressed()
			if err != nil {
				return nil, err
			}
			return &drainOnClose{rc}, nil
		}
	}
	u, err := artifact.UnpackLayers(root, open, artifact.UnpackOptions{Limits: l, ImageLayers: true, HardLinks: true, DropSpecial: true})
	if err != nil {
		return nil, err
	}
	return u.Dropped, nil
}

// layerTrailerBytes is how much a layer may hold after its tar ends (tar
// pads to 10 KiB records; gzip adds nothing a reader sees).
const layerTrailerBytes = 1 << 20

// drainOnClose reads a layer to its end before closing it, so
// go-containerregistry checks its digest (it does at EOF, which the tar
// reader never reaches), but not past layerTrailerBytes.
type drainOnClose struct{ io.ReadCloser }

func (d *drainOnClose) Close() error {
	n, err := io.CopyN(io.Discard, d.ReadCloser, layerTrailerBytes+1)
	cerr := d.ReadCloser.Close()
	switch {
	case err != nil && !errors.Is(err, io.EOF):
		return err
	case n > layerTrailerBytes:
		return fmt.Errorf("more than %d bytes follow the end of the layer's tar; refusing it", layerTrailerBytes)
	}
	return cerr
}

// lookPath resolves a relative entrypoint against the image's PATH, inside
// root, as a container runtime would.
func lookPath(root, cmd string, env []string) (string, error) {
	if path.IsAbs(cmd) {
		return cmd, nil
	}
	search := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			search = v
		}
	}
	for _, dir := range strings.Split(search, ":") {
		p := path.Join("/", dir, cmd)
		if fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(p))); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("entrypoint %q is not an absolute path and is not found on the image's PATH %s", cmd, search)
}

// ImageSnapshotsReport says what an edit of config-lampyr image-snapshots
// did besides the entries asked for.
type ImageSnapshotsReport struct {
	// Rewritten are old bare-digest keys (sha256:...) replaced by the full
	// repository@digest of an image registered now.
	Rewritten []string `json:"rewritten,omitempty"`
	// Removed are old bare-digest entries no image registered now names:
	// the controller refuses bare-digest keys (and with them the whole
	// map), so they are dropped; re-register their images to map them
	// again.
	Removed []RemovedImageSnapshot `json:"removed,omitempty"`
	// Normalized are keys rewritten to their normalized form (ImageKey).
	Normalized []string `json:"normalized,omitempty"`
	// Unparsable are keys neither a digest nor an image reference, kept as
	// they are: the controller refuses them; fix or remove them by hand.
	Unparsable []string `json:"unparsable,omitempty"`
}

// RemovedImageSnapshot is a dropped bare-digest entry.
type RemovedImageSnapshot struct {
	Digest   string `json:"digest"`
	Snapshot string `json:"snapshot"`
}

// Notes are the report as lines for people.
func (r *ImageSnapshotsReport) Notes() []string {
	var out []string
	for _, k := range r.Rewritten {
		out = append(out, fmt.Sprintf("rewrote the bare-digest key %s as the full image reference registered now", k))
	}
	for _, e := range r.Removed {
		out = append(out, fmt.Sprintf("removed the bare-digest entry %s -> %s: the controller refuses bare-digest keys (they would map the same bytes under any repository); map the image again with `ly image-snapshot REPOSITORY@%s --register`", e.Digest, e.Snapshot, e.Digest))
	}
	for _, k := range r.Normalized {
		out = append(out, "normalized the key "+k)
	}
	for _, k := range r.Unparsable {
		out = append(out, fmt.Sprintf("kept the key %q, which is not an image reference (repository@sha256:...): the controller refuses it; fix or remove it in config-lampyr %s", k, lampyrconfig.KeyImageSnapshots))
	}
	return out
}

// imageKey is the key image-snapshots maps an image under: its normalized
// repository@sha256:... (lampyrconfig.ImageKey, which the controller looks
// Revisions' images up with; never a bare digest).
func imageKey(image string) (string, error) {
	k, ok := lampyrconfig.ImageKey(image)
	if !ok {
		return "", fmt.Errorf("image %q: want a digest-pinned image reference, repository@sha256:<64 hex>", image)
	}
	return k, nil
}

// digestOf is the digest of an image key (repository@digest).
func digestOf(key string) string {
	_, d, _ := strings.Cut(key, "@")
	return d
}

// isBareDigest reports whether key is a digest alone (the old key form).
func isBareDigest(key string) bool {
	_, err := v1.NewHash(key)
	return err == nil
}

// RegisterImageSnapshots merges image -> snapshot entries into config-lampyr
// image-snapshots, keyed by the image's full repository@sha256:...
// (existing entries for other images are kept; an image already mapped is
// re-pointed). Old bare-digest keys are rewritten or removed (see
// ImageSnapshotsReport). It uses the resourceVersion it read, so concurrent
// registrations do not lose each other's entries.
func RegisterImageSnapshots(ctx context.Context, c *Cluster, snaps []*ImageSnapshot) error {
	_, err := EditImageSnapshots(ctx, c, snaps, nil)
	return err
}

// UnregisterImageSnapshots removes the entries of these images
// (repository@sha256:...) from config-lampyr image-snapshots. A bare digest
// (sha256:...) removes every entry of that digest, whatever its repository.
func UnregisterImageSnapshots(ctx context.Context, c *Cluster, images []string) error {
	_, err := EditImageSnapshots(ctx, c, nil, images)
	return err
}

// EditImageSnapshots maps snaps and removes the images of remove (see
// RegisterImageSnapshots and UnregisterImageSnapshots) in one write, and
// reports what else it changed.
func EditImageSnapshots(ctx context.Context, c *Cluster, snaps []*ImageSnapshot, remove []string) (*ImageSnapshotsReport, error) {
	set := map[string]string{}
	setDigests := map[string]bool{}
	for _, s := range snaps {
		k, err := imageKey(s.Image)
		if err != nil {
			return nil, err
		}
		if _, err := name.NewDigest(s.Snapshot); err != nil {
			return nil, fmt.Errorf("snapshot of %s: %q: want a digest-pinned artifact reference: %w", s.Image, s.Snapshot, err)
		}
		set[k] = s.Snapshot
		setDigests[digestOf(k)] = true
	}
	drop := map[string]bool{}   // full keys
	dropAt := map[string]bool{} // digests: every key of them
	for _, r := range remove {
		if isBareDigest(r) {
			dropAt[r] = true
			continue
		}
		k, err := imageKey(r)
		if err != nil {
			return nil, err
		}
		drop[k] = true
	}
	var rep *ImageSnapshotsReport
	err := editImageSnapshots(ctx, c, func(m map[string]string) error {
		rep = &ImageSnapshotsReport{}
		for _, k := range sortedKeys(m) {
			v := m[k]
			switch {
			case dropAt[k] || dropAt[digestOf(k)]:
				delete(m, k)
			case isBareDigest(k):
				delete(m, k)
				if setDigests[k] {
					rep.Rewritten = append(rep.Rewritten, k)
				} else {
					rep.Removed = append(rep.Removed, RemovedImageSnapshot{Digest: k, Snapshot: v})
				}
			default:
				nk, ok := lampyrconfig.ImageKey(k)
				switch {
				case !ok:
					rep.Unparsable = append(rep.Unparsable, k)
				case drop[nk]:
					delete(m, k)
				case nk != k:
					delete(m, k)
					if _, dup := m[nk]; !dup {
						m[nk] = v
					}
					rep.Normalized = append(rep.Normalized, k+" as "+nk)
				}
			}
		}
		maps.Copy(m, set)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return rep, nil
}

func editImageSnapshots(ctx context.Context, c *Cluster, edit func(map[string]string) error) error {
	for attempt := 0; ; attempt++ {
		cm, err := c.Kube.CoreV1().ConfigMaps(c.LampyrNamespace).Get(ctx, contract.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading %s/%s (is Lampyr installed? ly cluster install): %w", c.LampyrNamespace, contract.ConfigMapName, err)
		}
		m := map[string]string{}
		if v := cm.Data[lampyrconfig.KeyImageSnapshots]; strings.TrimSpace(v) != "" {
			if err := yaml.Unmarshal([]byte(v), &m); err != nil {
				return fmt.Errorf("%s/%s %s is not a YAML map; fix or remove it: %w", c.LampyrNamespace, contract.ConfigMapName, lampyrconfig.KeyImageSnapshots, err)
			}
		}
		if err := edit(m); err != nil {
			return err
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var b strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&b, "%s: %s\n", k, m[k])
		}
		patch, _ := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": cm.ResourceVersion},
			"data":     map[string]string{lampyrconfig.KeyImageSnapshots: b.String()},
		})
		_, err = c.Kube.CoreV1().ConfigMaps(c.LampyrNamespace).Patch(ctx, contract.ConfigMapName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "ly"})
		if apierrs.IsConflict(err) && attempt < 5 {
			continue
		}
		if err != nil {
			return fmt.Errorf("writing %s/%s %s: %w", c.LampyrNamespace, contract.ConfigMapName, lampyrconfig.KeyImageSnapshots, err)
		}
		return nil
	}
}
