package inputs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"lampyr.dev/serving/clusters/build/nodeimage"
	"lampyr.dev/serving/impl/build/filelock"
	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/build/image"
	"lampyr.dev/serving/impl/progress"
)

// recipe is bumped whenever the way an input is assembled changes without
// any pinned version changing, so caches rebuild.
const recipe = "1"

// DebianMirror is where debootstrap fetches the node's packages unless
// Builder.DebianMirror names another.
const DebianMirror = "http://deb.debian.org/debian"

// Result names what Build produced.
type Result struct {
	// NodeImage is the Kind node image, loaded into the local Docker engine.
	NodeImage string
	// RegistryImage is the CNCF Distribution image, loaded into Docker.
	RegistryImage string
	// ControlPlaneImages maps kubeadm's image names to their tarballs.
	ControlPlaneImages map[string]string
	// NetworkPolicyImage is the NetworkPolicy enforcer's image (kube-router's
	// netpol controller), preloaded into the node image's containerd.
	NetworkPolicyImage string
}

// Builder builds every offline cluster input.
type Builder struct {
	Cache string
	Log   *progress.Log
	// DebianMirror overrides the package source of the node image's rootfs
	// (default DebianMirror).
	DebianMirror string
	go_          *gobuild.Builder
}

// NewBuilder returns a Builder on the cache directory.
func NewBuilder(cache string, log *progress.Log) *Builder {
	return &Builder{Cache: cache, Log: log, go_: &gobuild.Builder{WorkDir: filepath.Join(cache, "go"), Log: log}}
}

// GoBuild builds spec through the shared, cached Go builder.
func (b *Builder) GoBuild(ctx context.Context, spec gobuild.Spec) ([]gobuild.Binary, error) {
	var bins []gobuild.Binary
	err := b.Log.Step(fmt.Sprintf("Building %s %s (%d command(s))", spec.Name, spec.Version, len(spec.Packages)), func() (err error) {
		bins, err = b.go_.Build(ctx, spec, "")
		return err
	})
	return bins, err
}

// Build makes (or finds in the cache) the node image and the registry image,
// and loads both into Docker, as a list of actions (buildActions): the
// rootfs (network-bound) runs beside the Go builds (CPU-bound), which run
// gobuild.Jobs() at a time.
func (b *Builder) Build(ctx context.Context) (*Result, error) {
	if err := os.MkdirAll(b.Cache, 0o755); err != nil {
		return nil, err
	}
	// One process at a time builds the inputs into a cache: the justfile
	// starts a build in the background while a suite compiles, and the
	// suite's harness then waits for it here and finds everything built.
	lock, err := filelock.Acquire(ctx, filepath.Join(b.Cache, "inputs.lock"), func(holder string) {
		b.Log.Printf("   waiting for process %s, which is building the cluster inputs into %s", holder, b.Cache)
	})
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	s := &buildState{b: b, res: &Result{ControlPlaneImages: map[string]string{}}}
	if err := runActions(ctx, b.Log, s, buildActions()); err != nil {
		return nil, err
	}
	return s.res, nil
}

// nodeAndImages assembles the control-plane images, the NetworkPolicy
// enforcer's image and the node image that holds them all.
func (b *Builder) nodeAndImages(ctx context.Context, res *Result, rootDir, rootTar, rootKey string, rootSpec nodeimage.RootfsSpec, required, cpBins, nodeBins, addonBins map[string]string) error {
	imgDir := filepath.Join(b.Cache, "images")
	var nodeKeyParts []string
	err := b.Log.Step(fmt.Sprintf("Assembling %d control-plane images", len(required)), func() error {
		for component, ref := range required {
			img, err := b.controlPlaneImage(ctx, component, rootDir, cpBins)
			if err != nil {
				return fmt.Errorf("image %s: %w", ref, err)
			}
			d, err := img.Digest()
			if err != nil {
				return err
			}
			file := filepath.Join(imgDir, component+"-"+d.Hex[:16]+".tar")
			if _, err := os.Stat(file); err != nil {
				if err := image.WriteTarball(file, ref, img); err != nil {
					return err
				}
			}
			res.ControlPlaneImages[ref] = file
			nodeKeyParts = append(nodeKeyParts, ref+"="+d.String())
		}
		return nil
	})
	if err != nil {
		return err
	}
	preload := maps.Clone(res.ControlPlaneImages)
	err = b.Log.Step("Assembling the NetworkPolicy enforcer's image (kube-router "+KubeRouterVersion+")", func() error {
		img, err := networkPolicyImage(ctx, rootDir, addonBins["kube-router-netpol"])
		if err != nil {
			return err
		}
		d, err := img.Digest()
		if err != nil {
			return err
		}
		ref := NetworkPolicyImageRef(d.Hex)
		file := filepath.Join(imgDir, "kube-router-netpol-"+d.Hex[:16]+".tar")
		if _, err := os.Stat(file); err != nil {
			if err := image.WriteTarball(file, ref, img); err != nil {
				return err
			}
		}
		res.NetworkPolicyImage = ref
		preload[ref] = file
		nodeKeyParts = append(nodeKeyParts, ref+"="+d.String())
		return nil
	})
	if err != nil {
		return err
	}
	node, err := b.nodeImage(ctx, nodeImageInputs{
		rootTar: rootTar, rootKey: rootKey, kindFiles: rootSpec.KindFiles, required: required,
		images: preload, imageKeys: nodeKeyParts, binaries: nodeBins,
	})
	if err != nil {
		return err
	}
	res.NodeImage = node
	return nil
}

// controlPlaneImage assembles one of kubeadm's images from its binary, where
// kubeadm's manifests expect it.
func (b *Builder) controlPlaneImage(ctx context.Context, component, rootDir string, bins map[string]string) (v1.Image, error) {
	path := bins[component]
	switch component {
	case "kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd":
		// kubeadm's static pods call these by name, as root.
		return image.FromBinary(path, component, image.Options{Root: true, BinaryPath: "/usr/local/bin/" + component, Entrypoint: []string{}})
	case "kube-proxy":
		// kube-proxy programs iptables/nftables: it needs those tools and
		// their libraries, taken from the node rootfs's own packages.
		files, _, err := nodeimage.ClosureFiles(ctx, rootDir, []string{"iptables", "nftables", "conntrack", "ipset"})
		if err != nil {
			return nil, err
		}
		tools, err := image.Layer(files)
		if err != nil {
			return nil, err
		}
		return image.FromBinary(path, component, image.Options{Root: true, BinaryPath: "/usr/local/bin/kube-proxy", Entrypoint: []string{}, ExtraLayers: []v1.Layer{tools}})
	case "coredns":
		// Upstream's image runs as nonroot with a file capability
		// (setcap cap_net_bind_service) to bind :53; kubeadm's Deployment
		// drops all capabilities but NET_BIND_SERVICE, which a root process
		// keeps, so root gives the same result without file capabilities.
		return image.FromBinary(path, component, image.Options{BinaryPath: "/coredns", Root: true})
	case "pause":
		return image.FromBinary(path, component, image.Options{BinaryPath: "/pause", Root: false})
	}
	return nil, fmt.Errorf("no recipe for kubeadm image component %q", component)
}

// KubeadmImages asks the built kubeadm which images it will run, keyed by
// component (the repository's last element), so names and tags never drift
// from the pinned Kubernetes version.
func KubeadmImages(ctx context.Context, kubeadm string) (map[string]string, error) {
	out, err := exec.CommandContext(ctx, kubeadm, "config", "images", "list", "--kubernetes-version", KubernetesVersion).Output()
	if err != nil {
		return nil, fmt.Errorf("kubeadm config images list: %w", err)
	}
	return ParseImageList(string(out))
}

// ParseImageList maps `kubeadm config images list` output by component.
func ParseImageList(out string) (map[string]string, error) {
	m := map[string]string{}
	for _, line := range strings.Fields(out) {
		repo, _, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("kubeadm image %q has no tag", line)
		}
		m[repo[strings.LastIndex(repo, "/")+1:]] = line
	}
	for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "etcd", "coredns", "pause"} {
		if m[c] == "" {
			return nil, fmt.Errorf("kubeadm did not list a %s image (got %v)", c, m)
		}
	}
	return m, nil
}

// CheckPins fails when kubeadm expects etcd or CoreDNS versions other than
// the pinned ones, instead of producing a node that would try to pull them.
func CheckPins(required map[string]string) error {
	etcdTag := required["etcd"][strings.LastIndex(required["etcd"], ":")+1:]
	if !strings.HasPrefix(etcdTag, strings.TrimPrefix(EtcdModuleVersion, "v")+"-") {
		return fmt.Errorf("kubeadm %s expects etcd %s but inputs pin %s: update EtcdModuleVersion", KubernetesVersion, etcdTag, EtcdModuleVersion)
	}
	if !strings.HasSuffix(required["coredns"], ":"+CoreDNSVersion) {
		return fmt.Errorf("kubeadm %s expects %s but inputs pin CoreDNS %s: update CoreDNSVersion", KubernetesVersion, required["coredns"], CoreDNSVersion)
	}
	return nil
}

func buildPause(ctx context.Context, src, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "gcc", "-Os", "-Wall", "-Werror", "-static", "-DVERSION=lampyr-"+KubernetesVersion, "-o", out+".tmp", src)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("gcc pause.c (install gcc and libc6-dev): %w: %s", err, b)
	}
	return os.Rename(out+".tmp", out)
}

// loadIntoDocker loads a docker-archive tarball unless Docker has ref.
func loadIntoDocker(ctx context.Context, ref, file string) error {
	if dockerHas(ctx, ref) {
		return nil
	}
	if out, err := exec.CommandContext(ctx, "docker", "load", "-i", file).CombinedOutput(); err != nil {
		return fmt.Errorf("docker load %s: %w: %s", file, err, out)
	}
	return nil
}

func (b *Builder) registryImage(ctx context.Context, registry string) (string, error) {
	config, err := image.Layer([]image.File{
		{Path: "/etc/distribution/config.yml", Mode: 0o644, Body: []byte(RegistryConfig)},
		{Path: "/var/lib/registry", Dir: true, Mode: 0o755, UID: image.NonRootUID},
	})
	if err != nil {
		return "", err
	}
	img, err := image.FromBinary(registry, "registry", image.Options{
		BinaryPath:  "/bin/registry",
		Args:        []string{"serve", "/etc/distribution/config.yml"},
		ExtraLayers: []v1.Layer{config},
	})
	if err != nil {
		return "", err
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	ref := "lampyr.dev/registry:" + strings.TrimPrefix(DistributionVersion, "v") + "-" + d.Hex[:12]
	file := filepath.Join(b.Cache, "images", "registry-"+d.Hex[:16]+".tar")
	err = b.Log.Step("Loading registry image "+ref, func() error {
		if _, err := os.Stat(file); err != nil {
			if err := image.WriteTarball(file, ref, img); err != nil {
				return err
			}
		}
		return loadIntoDocker(ctx, ref, file)
	})
	return ref, err
}

// RegistryConfig is CNCF Distribution's configuration: filesystem storage,
// deletes enabled (so tests can clean up), listening on 5000.
const RegistryConfig = `version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: /var/lib/registry
  delete:
    enabled: true
http:
  addr: :5000
`

func hashOf(parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(h[:])[:16]
}

func or(v, d string) string {
	if v != "" {
		return v
	}
	return d
}

// dockerHas reports whether the local Docker engine has image ref.
func dockerHas(ctx context.Context, ref string) bool {
	return exec.CommandContext(ctx, "docker", "image", "inspect", ref).Run() == nil
}
