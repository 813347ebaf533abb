package inputs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"lampyr.dev/serving/clusters/build/nodeimage"
	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/progress"
)

// An action is one step of Build, kind's style (its cluster create
// actions): a name for the progress line Build prints around it with its
// duration, and Execute, which reads what earlier actions left in the
// buildState and adds its own. Each action finds its output in the cache
// when the pinned versions have not changed.
type action interface {
	Name() string
	Execute(ctx context.Context, s *buildState) error
}

// buildActions are Build's steps, in order.
func buildActions() []action {
	return []action{
		fetchSources{},
		concurrently{"Node rootfs beside the Go binaries", []action{ensureRootfs{}, ensureBinaries{}}},
		ensurePause{},
		checkKubeadmImages{},
		ensureNodeImage{},
		ensureRegistryImage{},
	}
}

// buildState is what Build's actions hand on to each other.
type buildState struct {
	b *Builder
	// fetchSources
	kindDir, k8sDir           string
	rootSpec                  nodeimage.RootfsSpec
	rootKey, rootDir, rootTar string
	// ensureBinaries
	k8sBins, etcdBins, dnsBins, crictlBins, regBins, netpolBins []gobuild.Binary
	// ensurePause
	pause string
	// checkKubeadmImages: kubeadm's images by component
	required map[string]string
	// ensureNodeImage, ensureRegistryImage
	res *Result
}

// runActions runs actions in order, each between a start line and an end
// line with its duration; the first error stops the run.
func runActions(ctx context.Context, log *progress.Log, s *buildState, actions []action) error {
	for _, a := range actions {
		if err := log.Step(a.Name(), func() error { return a.Execute(ctx, s) }); err != nil {
			return err
		}
	}
	return nil
}

// fetchSources downloads the kind and Kubernetes modules (the node's
// entrypoint, units and containerd config; pause.c) and settles the
// rootfs's spec and cache key.
type fetchSources struct{}

func (fetchSources) Name() string {
	return "Fetching sigs.k8s.io/kind " + KindVersion + " and k8s.io/kubernetes " + KubernetesVersion
}

func (fetchSources) Execute(ctx context.Context, s *buildState) error {
	kindDir, err := gobuild.Download(ctx, "sigs.k8s.io/kind", KindVersion)
	if err != nil {
		return err
	}
	k8sMod, err := gobuild.Download(ctx, "k8s.io/kubernetes", KubernetesVersion)
	if err != nil {
		return err
	}
	s.kindDir, s.k8sDir = kindDir.Dir, k8sMod.Dir
	s.rootSpec = nodeimage.RootfsSpec{Suite: DebianSuite, Mirror: or(s.b.DebianMirror, DebianMirror),
		Packages: NodePackages, KindFiles: filepath.Join(kindDir.Dir, "images/base/files")}
	s.rootKey = hashOf(recipe, s.rootSpec.Suite, s.rootSpec.Mirror, strings.Join(s.rootSpec.Packages, ","), KindVersion)
	s.rootDir = filepath.Join(s.b.Cache, "rootfs", "bookworm-"+s.rootKey)
	s.rootTar = s.rootDir + ".tar"
	return nil
}

// concurrently runs its actions at the same time, each between its own
// progress lines: the rootfs (network-bound) beside the Go builds
// (CPU-bound). The first error cancels the others.
type concurrently struct {
	name    string
	actions []action
}

func (c concurrently) Name() string { return c.name }

func (c concurrently) Execute(ctx context.Context, s *buildState) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, a := range c.actions {
		g.Go(func() error { return s.b.Log.Step(a.Name(), func() error { return a.Execute(gctx, s) }) })
	}
	return g.Wait()
}

// ensureRootfs debootstraps the node's root filesystem and tars it, unless
// the tarball for this rootfs key is cached.
type ensureRootfs struct{}

func (ensureRootfs) Name() string {
	return "Node rootfs (debootstrap " + DebianSuite + ", " + fmt.Sprint(len(NodePackages)) + " packages)"
}

func (ensureRootfs) Execute(ctx context.Context, s *buildState) error {
	if _, err := os.Stat(s.rootTar); err == nil {
		return nil
	}
	if _, err := os.Stat(s.rootDir); err != nil {
		if err := os.MkdirAll(filepath.Dir(s.rootDir), 0o755); err != nil {
			return err
		}
		if err := nodeimage.BuildRootfs(ctx, s.rootSpec, s.rootDir, s.b.Log); err != nil {
			return err
		}
	}
	return nodeimage.TarDir(ctx, s.rootDir, s.rootTar)
}

// ensureBinaries builds every Go input through the shared, cached Go
// builder, all asked for at once: the builder runs gobuild.Jobs() of them
// at a time (one go build keeps about one core busy), Kubernetes first.
type ensureBinaries struct{}

func (ensureBinaries) Name() string {
	return "Go binaries (Kubernetes, etcd, CoreDNS, crictl, Distribution, kube-router netpol)"
}

func (ensureBinaries) Execute(ctx context.Context, s *buildState) error {
	b := s.b
	k8sSpec, err := KubernetesSpec(ctx)
	if err != nil {
		return err
	}
	builds := []struct {
		spec gobuild.Spec
		out  *[]gobuild.Binary
	}{
		{k8sSpec, &s.k8sBins}, {CoreDNSSpec(), &s.dnsBins}, {NetworkPolicySpec(), &s.netpolBins},
		{RegistrySpec(), &s.regBins}, {CrictlSpec(), &s.crictlBins}, {EtcdSpec(), &s.etcdBins},
	}
	g, gctx := errgroup.WithContext(ctx)
	for i, x := range builds {
		g.Go(func() (err error) {
			if i > 0 {
				// Ask in this order: the slots are taken first come.
				time.Sleep(time.Duration(i) * 20 * time.Millisecond)
			}
			*x.out, err = b.GoBuild(gctx, x.spec)
			return err
		})
	}
	return g.Wait()
}

// ensurePause compiles Kubernetes' pause.c statically, unless this
// Kubernetes version's binary is cached.
type ensurePause struct{}

func (ensurePause) Name() string { return "pause (gcc -static)" }

func (ensurePause) Execute(ctx context.Context, s *buildState) error {
	s.pause = filepath.Join(s.b.Cache, "pause", "pause-"+hashOf(recipe, KubernetesVersion))
	if _, err := os.Stat(s.pause); err == nil {
		return nil
	}
	return buildPause(ctx, filepath.Join(s.k8sDir, "build/pause/linux/pause.c"), s.pause)
}

// checkKubeadmImages asks the built kubeadm which images it runs and checks
// its etcd and CoreDNS against the pins.
type checkKubeadmImages struct{}

func (checkKubeadmImages) Name() string { return "kubeadm's images, checked against the pins" }

func (checkKubeadmImages) Execute(ctx context.Context, s *buildState) error {
	required, err := KubeadmImages(ctx, binary(s.k8sBins, "kubeadm"))
	if err != nil {
		return err
	}
	s.required = required
	return CheckPins(required)
}

// ensureNodeImage finds the node image a previous run made from the same
// inputs (the memo), or assembles the control-plane images, the
// NetworkPolicy enforcer's image and the node image holding them.
type ensureNodeImage struct{}

func (ensureNodeImage) Name() string { return "Node image (Kubernetes " + KubernetesVersion + ")" }

func (ensureNodeImage) Execute(ctx context.Context, s *buildState) error {
	b, res := s.b, s.res
	imgDir := filepath.Join(b.Cache, "images")
	if err := os.MkdirAll(imgDir, 0o755); err != nil {
		return err
	}
	cpBins := map[string]string{
		"kube-apiserver": binary(s.k8sBins, "kube-apiserver"), "kube-controller-manager": binary(s.k8sBins, "kube-controller-manager"),
		"kube-scheduler": binary(s.k8sBins, "kube-scheduler"), "kube-proxy": binary(s.k8sBins, "kube-proxy"),
		"etcd": binary(s.etcdBins, "server"), "coredns": binary(s.dnsBins, "coredns"), "pause": s.pause,
	}
	nodeBins := map[string]string{
		"/usr/bin/kubelet": binary(s.k8sBins, "kubelet"), "/usr/bin/kubeadm": binary(s.k8sBins, "kubeadm"),
		"/usr/bin/kubectl": binary(s.k8sBins, "kubectl"), "/usr/local/bin/crictl": binary(s.crictlBins, "crictl"),
	}
	addonBins := map[string]string{"kube-router-netpol": binary(s.netpolBins, "kube-router-netpol")}
	// A warm run finds the node image it made last time without
	// re-assembling (and re-compressing) the control-plane images.
	memo, err := newNodeMemo(imgDir, s.rootKey, s.required, cpBins, nodeBins, addonBins)
	if err != nil {
		return err
	}
	if m, ok := memo.load(ctx); ok {
		res.NodeImage, res.ControlPlaneImages, res.NetworkPolicyImage = m.NodeImage, m.ControlPlaneImages, m.NetworkPolicyImage
		return nil
	}
	if err := b.nodeAndImages(ctx, res, s.rootDir, s.rootTar, s.rootKey, s.rootSpec, s.required, cpBins, nodeBins, addonBins); err != nil {
		return err
	}
	return memo.save(res)
}

// ensureRegistryImage assembles CNCF Distribution's image and loads it into
// Docker.
type ensureRegistryImage struct{}

func (ensureRegistryImage) Name() string {
	return "Registry image (Distribution " + DistributionVersion + ")"
}

func (ensureRegistryImage) Execute(ctx context.Context, s *buildState) error {
	reg, err := s.b.registryImage(ctx, binary(s.regBins, "distribution"))
	if err != nil {
		return err
	}
	s.res.RegistryImage = reg
	return nil
}

// binary is the path of the built binary called name.
func binary(bins []gobuild.Binary, name string) string {
	for _, x := range bins {
		if filepath.Base(x.Path) == name {
			return x.Path
		}
	}
	panic("no binary " + name) // programming error: names come from the specs
}
