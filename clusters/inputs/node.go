package inputs

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"lampyr.dev/serving/clusters/build/nodeimage"
	"lampyr.dev/serving/impl/build/image"
)

// PodSubnet is the pod range of every offline cluster (single node each,
// separate Docker network namespaces, so clusters may share it).
const PodSubnet = "10.244.0.0/16"

// ServiceSubnet is the Service range of every offline cluster (kind's
// default, set explicitly because the NetworkPolicy enforcer is told it).
const ServiceSubnet = "10.96.0.0/16"

// NodeImageRepo is the repository of the offline Kind node image.
const NodeImageRepo = "lampyr.dev/kind-node"

// nodeRecipe is bumped when the node image's assembly changes (2: images
// preloaded into containerd at build time instead of at every boot; 3: the
// NetworkPolicy enforcer's image preloaded too).
const nodeRecipe = "3"

type nodeImageInputs struct {
	rootTar, rootKey, kindFiles string
	required                    map[string]string
	images                      map[string]string // ref -> tarball, every image preloaded into containerd
	imageKeys                   []string
	binaries                    map[string]string // path in node -> file
}

// nodeImage stacks the Kubernetes layer (binaries, preloaded images, CNI,
// patched containerd config) on the rootfs layer and loads the result into
// Docker as lampyr.dev/kind-node:<version>-<key>.
func (b *Builder) nodeImage(ctx context.Context, in nodeImageInputs) (string, error) {
	keyParts := append([]string{recipe, nodeRecipe, in.rootKey}, in.imageKeys...)
	bins, err := fileKeyParts(in.binaries)
	if err != nil {
		return "", err
	}
	sort.Strings(keyParts[3:])
	key := hashOf(append(keyParts, bins...)...)
	ref := NodeImageRepo + ":" + KubernetesVersion + "-" + key[:12]
	if dockerHas(ctx, ref) {
		return ref, nil
	}
	baseRef := NodeImageRepo + "-base:" + KubernetesVersion + "-" + key[:12]
	file := filepath.Join(b.Cache, "images", "kind-node-base-"+key+".tar")
	if _, err := os.Stat(file); err != nil {
		if err := b.Log.Step("Assembling node image "+baseRef, func() error {
			img, err := b.assembleNode(in)
			if err != nil {
				return err
			}
			return image.WriteTarball(file, baseRef, img)
		}); err != nil {
			return "", err
		}
	}
	if err := b.Log.Step("Loading node base image into Docker", func() error { return loadIntoDocker(ctx, baseRef, file) }); err != nil {
		return "", err
	}
	return ref, b.Log.Step(fmt.Sprintf("Preloading %d images into the node image's containerd", len(in.images)), func() error {
		return preloadImages(ctx, baseRef, ref, in.images)
	})
}

// preloadImages imports the control-plane images into containerd's content
// store inside baseRef and commits the result as ref, the way kind's own
// node-image build does (a build container, `ctr images import
// --no-unpack`, `docker commit`). Importing at build time instead of at
// every node boot took ~8.6 s off each cluster's creation (containerd's
// content ingest is fsync-bound). Content only: the CRI unpacks each
// image when its first container starts.
func preloadImages(ctx context.Context, baseRef, ref string, images map[string]string) error {
	name := fmt.Sprintf("lampyr-node-build-%d", os.Getpid())
	docker := func(stdin io.Reader, args ...string) error {
		cmd := exec.CommandContext(ctx, "docker", args...)
		cmd.Stdin = stdin
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	_ = exec.Command("docker", "rm", "-f", name).Run() // a leftover of an interrupted build
	if err := docker(nil, "run", "-d", "--name", name, "--entrypoint=sleep", "--security-opt", "seccomp=unconfined", baseRef, "infinity"); err != nil {
		return err
	}
	defer exec.Command("docker", "rm", "-f", name).Run() //nolint:errcheck // best effort; the container holds nothing of value
	if err := docker(nil, "exec", "--privileged", name, "bash", "-c", nodeimage.PreloadStartScript); err != nil {
		return fmt.Errorf("starting containerd in the node build container: %w", err)
	}
	refs := make([]string, 0, len(images))
	for r := range images {
		refs = append(refs, r)
	}
	sort.Strings(refs)
	for _, r := range refs {
		f, err := os.Open(images[r])
		if err != nil {
			return err
		}
		err = docker(f, "exec", "-i", "--privileged", name, "ctr", "--namespace=k8s.io", "images", "import", "--all-platforms", "--no-unpack", "--digests", "-")
		f.Close()
		if err != nil {
			return fmt.Errorf("importing %s: %w", r, err)
		}
	}
	if err := docker(nil, "exec", "--privileged", name, "bash", "-c", nodeimage.PreloadFinishScript); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "docker", "exec", name, "ctr", "--namespace=k8s.io", "images", "list", "-q").Output()
	if err != nil {
		return fmt.Errorf("listing preloaded images: %w", err)
	}
	if missing := missingRefs(refs, strings.Fields(string(out))); len(missing) > 0 {
		return fmt.Errorf("containerd in the node image lacks %v after import", missing)
	}
	if err := docker(nil, "exec", "--privileged", name, "bash", "-c", nodeimage.PreloadStopScript); err != nil {
		return fmt.Errorf("stopping containerd in the node build container: %w", err)
	}
	return docker(nil, "commit",
		"--change", `ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]`,
		"--change", `CMD []`,
		name, ref)
}

// missingRefs lists the wanted image references absent from have.
func missingRefs(want, have []string) []string {
	set := map[string]bool{}
	for _, h := range have {
		set[h] = true
	}
	var missing []string
	for _, w := range want {
		if !set[w] {
			missing = append(missing, w)
		}
	}
	return missing
}

func (b *Builder) assembleNode(in nodeImageInputs) (v1.Image, error) {
	root, err := tarball.LayerFromFile(in.rootTar)
	if err != nil {
		return nil, err
	}
	kindConfig, err := os.ReadFile(filepath.Join(in.kindFiles, "etc/containerd/config.toml"))
	if err != nil {
		return nil, err
	}
	// The capability filter is only needed where the host lacks the
	// capability; elsewhere containerd keeps kind's setting.
	restrictOOM := !HostHasCapability(capSysResource)
	containerdConfig, err := nodeimage.PatchContainerdConfig(string(kindConfig), in.required["pause"], restrictOOM)
	if err != nil {
		return nil, err
	}
	files := []image.File{
		{Path: "/kind/version", Mode: 0o644, Body: []byte(KubernetesVersion)},
		{Path: "/etc/containerd/config.toml", Mode: 0o644, Body: []byte(containerdConfig)},
		{Path: "/etc/cni/net.d/10-lampyr-ptp.conflist", Mode: 0o644, Body: []byte(nodeimage.CNIConfig(PodSubnet))},
		{Path: "/kind/manifests/default-storage.yaml", Mode: 0o644, Body: []byte(nodeimage.DefaultStorageManifest)},
	}
	for p, f := range in.binaries {
		body, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		files = append(files, image.File{Path: p, Mode: 0o755, Body: body})
	}
	kube, err := image.Layer(files)
	if err != nil {
		return nil, err
	}
	return image.Assemble([]v1.Layer{root, kube}, v1.Config{
		Entrypoint: []string{"/usr/local/bin/entrypoint", "/sbin/init"},
		Env:        []string{"container=docker", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		StopSignal: "SIGRTMIN+3",
		Labels:     map[string]string{"dev.lampyr.kubernetes-version": KubernetesVersion},
	})
}

// nodeMemo remembers, per set of node inputs, which node image and
// control-plane tarballs they produced. The inputs are files whose paths
// hold their build's cache key (reproducible builds), so path and size
// identify them.
type nodeMemo struct {
	file string
}

type nodeMemoBody struct {
	NodeImage          string            `json:"nodeImage"`
	ControlPlaneImages map[string]string `json:"controlPlaneImages"`
	NetworkPolicyImage string            `json:"networkPolicyImage"`
}

func newNodeMemo(dir, rootKey string, required, cpBins, nodeBins, addonBins map[string]string) (*nodeMemo, error) {
	parts := []string{recipe, nodeRecipe, rootKey, KubernetesVersion, fmt.Sprint(HostHasCapability(capSysResource))}
	for _, m := range []map[string]string{required, cpBins, nodeBins, addonBins} {
		kv, err := fileKeyParts(m)
		if err != nil {
			return nil, err
		}
		parts = append(parts, kv...)
	}
	return &nodeMemo{file: filepath.Join(dir, "node-memo-"+hashOf(parts...)+".json")}, nil
}

// fileKeyParts renders m as sorted "key=value" lines for a cache key; a value
// that is a file's absolute path becomes "path:size". The path holds its
// build's cache key and a rebuild of the same key is reproducible, so mtime
// must not change a key.
func fileKeyParts(m map[string]string) ([]string, error) {
	kv := make([]string, 0, len(m))
	for k, v := range m {
		if filepath.IsAbs(v) {
			st, err := os.Stat(v)
			if err != nil {
				return nil, err
			}
			v = fmt.Sprintf("%s:%d", v, st.Size())
		}
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	return kv, nil
}

// load returns the remembered result when everything it names still exists.
func (m *nodeMemo) load(ctx context.Context) (nodeMemoBody, bool) {
	var body nodeMemoBody
	b, err := os.ReadFile(m.file)
	if err != nil || json.Unmarshal(b, &body) != nil || body.NodeImage == "" || body.NetworkPolicyImage == "" {
		return body, false
	}
	for _, f := range body.ControlPlaneImages {
		if _, err := os.Stat(f); err != nil {
			return body, false
		}
	}
	return body, dockerHas(ctx, body.NodeImage)
}

func (m *nodeMemo) save(res *Result) error {
	b, err := json.Marshal(nodeMemoBody{NodeImage: res.NodeImage, ControlPlaneImages: res.ControlPlaneImages, NetworkPolicyImage: res.NetworkPolicyImage})
	if err != nil {
		return err
	}
	tmp := m.file + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, m.file)
}
