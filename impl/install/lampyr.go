package install

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/build/image"
	"lampyr.dev/serving/impl/build/publish"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/fiberd/backend/gvisor/runscpin"
	"lampyr.dev/serving/impl/install/knative"
	"lampyr.dev/serving/impl/install/manifest"
)

// Lampyr's installation inputs may come from outside instead of this
// checkout (seed 000, "Cluster suite inputs"): a resolved controller
// manifest and the Home (grant) and helper images, or one directory holding
// all of them. These are the environment variables the commands and the
// suites read into LampyrSources (the installer itself reads none);
// EnvGrantImage and EnvHelperImage are also the grant controller's own
// variables, which setHomeImages fills in its Deployment.
const (
	EnvClusterInputs      = "LAMPYR_CLUSTER_INPUTS"      // dir with lampyr.yaml, grant-image, helper-image
	EnvControllerManifest = "LAMPYR_CONTROLLER_MANIFEST" // a resolved manifest of every Lampyr component
	EnvGrantImage         = "LAMPYR_GRANT_IMAGE"         // the Home image (fiberd + helper)
	EnvHelperImage        = "LAMPYR_HELPER_IMAGE"        // an image holding /lampyr-helper
	EnvFiberBackend       = "LAMPYR_FIBER_BACKEND"       // config-lampyr fiber-backend: process or gvisor
)

// LampyrSources say where Lampyr's components come from; the zero value
// builds every one from the checkout. Callers fill it from the environment
// variables above (LampyrSourcesFrom).
type LampyrSources struct {
	// InputsDir holds lampyr.yaml, grant-image and helper-image
	// (EnvClusterInputs); when set, the other fields are ignored.
	InputsDir string
	// ControllerManifest is a resolved manifest of every Lampyr component
	// (EnvControllerManifest); it needs GrantImage.
	ControllerManifest string
	// GrantImage is the Home image, pinned by digest (EnvGrantImage);
	// empty builds it from the checkout.
	GrantImage string
	// HelperImage holds /lampyr-helper (EnvHelperImage); empty means the
	// Home image holds it.
	HelperImage string
	// FiberBackend is config-lampyr's fiber-backend (EnvFiberBackend):
	// what runs fibers in every Home; empty keeps the manifest's
	// (process).
	FiberBackend string
}

// LampyrSourcesFrom reads LampyrSources from the environment variables
// above through getenv: os.Getenv at a command's edge (`ly cluster
// install`, clusters/environ.Clusters).
func LampyrSourcesFrom(getenv func(string) string) LampyrSources {
	return LampyrSources{
		InputsDir:          getenv(EnvClusterInputs),
		ControllerManifest: getenv(EnvControllerManifest),
		GrantImage:         getenv(EnvGrantImage),
		HelperImage:        getenv(EnvHelperImage),
		FiberBackend:       getenv(EnvFiberBackend),
	}
}

// ImplConfigDir is where Lampyr's manifests live in this repository.
const ImplConfigDir = "impl/config"

// ModulePath is this repository's module; ko:// references under it are
// built from the checkout.
const ModulePath = "lampyr.dev/serving"

// HomePackages are the binaries of the Home image: fiberd runs in the grant
// Pod and starts lampyr-helper as each fiber's first process.
var HomePackages = []string{ModulePath + "/impl/cmd/fiberd", ModulePath + "/impl/cmd/lampyr-helper"}

// LampyrInputs are the resolved Lampyr components of an installation.
type LampyrInputs struct {
	Objects     []*unstructured.Unstructured
	GrantImage  string
	HelperImage string
}

// LampyrComponents returns Lampyr's components, from src when it names
// them, else built from this checkout (root) and pushed.
func LampyrComponents(ctx context.Context, root string, p *publish.Publisher, src LampyrSources) (*LampyrInputs, error) {
	if dir := src.InputsDir; dir != "" {
		return fromInputsDir(dir)
	}
	in := &LampyrInputs{GrantImage: src.GrantImage, HelperImage: src.HelperImage}
	if mf := src.ControllerManifest; mf != "" {
		raw, err := os.ReadFile(mf)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvControllerManifest, err)
		}
		if in.Objects, err = manifest.Parse(raw); err != nil {
			return nil, fmt.Errorf("%s %s: %w", EnvControllerManifest, mf, err)
		}
		if in.GrantImage == "" {
			return nil, fmt.Errorf("%s is set, so %s must name the Home image too", EnvControllerManifest, EnvGrantImage)
		}
		return in, setHomeImages(in)
	}
	objs, err := manifest.ReadDir(filepath.Join(root, ImplConfigDir))
	if err != nil {
		return nil, err
	}
	refs := koRefs(objs)
	pkgs := append(append([]string(nil), refs...), HomePackages...)
	sort.Strings(pkgs)
	pkgs = slices.Compact(pkgs)
	spec := gobuild.Spec{Name: "lampyr", Dir: root, Packages: pkgs, LDFlags: "-s -w"}
	var imgs []publish.Image
	for _, r := range refs {
		imgs = append(imgs, publish.Image{Package: r, Repo: "lampyr/" + path.Base(r)})
	}
	bins, err := p.Go.Build(ctx, spec, "")
	if err != nil {
		return nil, err
	}
	byPkg := map[string]string{}
	for _, b := range bins {
		byPkg[b.Package] = b.Path
	}
	if in.GrantImage == "" {
		// The Home image carries runsc for the gvisor fiber backend
		// (config-lampyr fiber-backend), built once per pinned version.
		rs, err := p.Go.Build(ctx, runscpin.Spec(), "")
		if err != nil {
			return nil, fmt.Errorf("building runsc for the Home image: %w", err)
		}
		byPkg[rs[0].Package] = rs[0].Path
	}
	images := map[string]string{}
	for _, im := range imgs {
		img, err := image.FromBinary(byPkg[im.Package], path.Base(im.Package), im.Options)
		if err != nil {
			return nil, err
		}
		if images[im.Package], err = p.Push(ctx, im.Repo, "dev", img); err != nil {
			return nil, err
		}
	}
	if in.GrantImage == "" {
		home, err := homeImage(byPkg)
		if err != nil {
			return nil, err
		}
		if in.GrantImage, err = p.Push(ctx, "lampyr/home", "dev", home); err != nil {
			return nil, err
		}
	}
	// The Home image built here holds /lampyr-helper itself, so HelperImage
	// stays empty unless src.HelperImage (LAMPYR_HELPER_IMAGE) names one: no init container
	// copies the helper in (the bench measured a Home Pod from scheduled to
	// started in 4.1 s with it, 1.8 s without).
	ko := make([]knative.Object, len(objs))
	for i, o := range objs {
		ko[i] = knative.Object{Unstructured: o, Source: ImplConfigDir}
	}
	if err := knative.ResolveImages(ko, images); err != nil {
		return nil, err
	}
	in.Objects = objs
	return in, setHomeImages(in)
}

// homeImage puts fiberd, lampyr-helper and runsc where the grant
// controller's Home Pod expects them (/fiberd, /lampyr-helper, /runsc);
// fiberd runs as root because it creates namespaces and cgroups for each
// fiber.
func homeImage(bins map[string]string) (v1.Image, error) {
	helper, err := os.ReadFile(bins[ModulePath+"/impl/cmd/lampyr-helper"])
	if err != nil {
		return nil, err
	}
	runsc, err := os.ReadFile(bins[runscpin.Spec().Packages[0]])
	if err != nil {
		return nil, err
	}
	layer, err := image.Layer([]image.File{{Path: "/lampyr-helper", Mode: 0o755, Body: helper}, {Path: runscpin.HomePath, Mode: 0o755, Body: runsc}})
	if err != nil {
		return nil, err
	}
	return image.FromBinary(bins[ModulePath+"/impl/cmd/fiberd"], "fiberd", image.Options{Root: true, BinaryPath: "/fiberd", ExtraLayers: []v1.Layer{layer}})
}

// setHomeImages writes the Home and helper images into the grant
// controller's environment (its documented override variables). Both must
// be pinned by digest: the grant controller refuses others
// (HomeImageNotPinned), so an install says so at once.
func setHomeImages(in *LampyrInputs) error {
	for env, img := range map[string]string{EnvGrantImage: in.GrantImage, EnvHelperImage: in.HelperImage} {
		if img == "" {
			continue
		}
		if _, err := name.NewDigest(img); err != nil {
			return fmt.Errorf("%s %q: the Home's images must be pinned by digest (repository@sha256:...): %w", env, img, err)
		}
	}
	for _, o := range in.Objects {
		if o.GetKind() != "Deployment" || o.GetName() != contract.GrantControllerName {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range cs {
			cm := c.(map[string]any)
			env, _ := cm["env"].([]any)
			for _, e := range env {
				em := e.(map[string]any)
				switch em["name"] {
				case EnvGrantImage:
					em["value"] = in.GrantImage
				case EnvHelperImage:
					em["value"] = in.HelperImage
				}
			}
		}
		return unstructured.SetNestedSlice(o.Object, cs, "spec", "template", "spec", "containers")
	}
	return fmt.Errorf("Lampyr manifests have no lampyr-grant-controller Deployment to give the Home image to")
}

// SetBackendStrategy sets config-lampyr's backend-strategy (the feasibility
// gate's result for the networking provider).
func SetBackendStrategy(objs []*unstructured.Unstructured, strategy string) error {
	return SetConfig(objs, lampyrconfig.KeyBackendStrategy, strategy)
}

// SetConfig sets one key of config-lampyr.
func SetConfig(objs []*unstructured.Unstructured, key, value string) error {
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && o.GetName() == contract.ConfigMapName {
			return unstructured.SetNestedField(o.Object, value, "data", key)
		}
	}
	return fmt.Errorf("Lampyr manifests have no config-lampyr ConfigMap")
}

func fromInputsDir(dir string) (*LampyrInputs, error) {
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "", fmt.Errorf("%s=%s: %w (expected lampyr.yaml, grant-image and helper-image)", EnvClusterInputs, dir, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	mf, err := read("lampyr.yaml")
	if err != nil {
		return nil, err
	}
	in := &LampyrInputs{}
	if in.Objects, err = manifest.Parse([]byte(mf)); err != nil {
		return nil, err
	}
	if in.GrantImage, err = read("grant-image"); err != nil {
		return nil, err
	}
	if in.HelperImage, err = read("helper-image"); err != nil {
		return nil, err
	}
	return in, setHomeImages(in)
}

func koRefs(objs []*unstructured.Unstructured) []string {
	ko := make([]knative.Object, len(objs))
	for i, o := range objs {
		ko[i] = knative.Object{Unstructured: o}
	}
	var out []string
	for _, r := range knative.KoReferences(ko) {
		if strings.HasPrefix(r, ModulePath+"/") {
			out = append(out, r)
		}
	}
	return out
}
