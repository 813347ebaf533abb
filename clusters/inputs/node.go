package inputs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"lampyr.dev/serving/clusters/build/image"
	"lampyr.dev/serving/clusters/build/nodeimage"
)

// PodSubnet is the pod range of every offline cluster (single node each,
// separate Docker network namespaces, so clusters may share it).
const PodSubnet = "10.244.0.0/16"

// NodeImageRepo is the repository of the offline Kind node image.
const NodeImageRepo = "lampyr.dev/kind-node"

type nodeImageInputs struct {
	rootTar, rootKey, kindFiles string
	required                    map[string]string
	images                      map[string]string // ref -> tarball
	imageKeys                   []string
	binaries                    map[string]string // path in node -> file
}

// nodeImage stacks the Kubernetes layer (binaries, preloaded images, CNI,
// patched containerd config) on the rootfs layer and loads the result into
// Docker as lampyr.dev/kind-node:<version>-<key>.
func (b *Builder) nodeImage(ctx context.Context, in nodeImageInputs) (string, error) {
	keyParts := append([]string{recipe, in.rootKey}, in.imageKeys...)
	bins := make([]string, 0, len(in.binaries))
	for p, f := range in.binaries {
		st, err := os.Stat(f)
		if err != nil {
			return "", err
		}
		// The file's path holds its build's cache key; a rebuild of the
		// same key is reproducible, so mtime must not change the node image.
		bins = append(bins, fmt.Sprintf("%s=%s:%d", p, f, st.Size()))
	}
	sort.Strings(bins)
	sort.Strings(keyParts[2:])
	key := hashOf(append(keyParts, bins...)...)
	ref := NodeImageRepo + ":" + KubernetesVersion + "-" + key[:12]
	file := filepath.Join(b.Cache, "images", "kind-node-"+key+".tar")

	if _, err := os.Stat(file); err != nil {
		if err := b.Log.Step("Assembling node image "+ref, func() error {
			img, err := b.assembleNode(in)
			if err != nil {
				return err
			}
			return image.WriteTarball(file, ref, img)
		}); err != nil {
			return "", err
		}
	}
	return ref, b.Log.Step("Loading node image into Docker", func() error { return loadIntoDocker(ctx, ref, file) })
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
		{Path: "/etc/systemd/system/lampyr-import-images.service", Mode: 0o644, Body: []byte(nodeimage.ImportUnit)},
		{Path: "/etc/systemd/system/multi-user.target.wants/lampyr-import-images.service", Symlink: "/etc/systemd/system/lampyr-import-images.service"},
		// kind's enabled units live in the same .wants directory; the
		// rootfs layer's links stay because a layer only adds entries.
		{Path: "/kind/bin/lampyr-import-images.sh", Mode: 0o755, Body: []byte(nodeimage.ImportScript)},
		{Path: "/kind/manifests/default-storage.yaml", Mode: 0o644, Body: []byte(nodeimage.DefaultStorageManifest)},
	}
	for p, f := range in.binaries {
		body, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		files = append(files, image.File{Path: p, Mode: 0o755, Body: body})
	}
	for ref, f := range in.images {
		body, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		files = append(files, image.File{Path: "/kind/images/" + imageFileName(ref), Mode: 0o644, Body: body})
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

func imageFileName(ref string) string {
	r := strings.NewReplacer("/", "_", ":", "_")
	return r.Replace(ref) + ".tar"
}
