// Package knative renders Knative Serving's release manifests from the pinned
// knative.dev/serving module's own config/core tree, the way Knative's
// release does (ko resolve -R -f config/core), with ko:// references
// resolved to images this project builds, and into two install profiles:
// stock (everything) and lampyr (upstream CRDs, webhook, configuration,
// certificates and RBAC, with the Pod-based Revision machinery filtered out
// before apply).
package knative

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/mod/modfile"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/install/manifest"
)

// ServingModule and ServingVersion pin Knative Serving 1.23.
const (
	ServingModule  = "knative.dev/serving"
	ServingVersion = "v0.50.0"
	// PreviousServingVersion is the minor release before ServingVersion
	// that the module proxy serves (v0.49.0 and v0.49.1 are served; v0.48.x
	// is not): the operations suite installs stock Knative at it and
	// upgrades to ServingVersion and back, the reference for Lampyr's own
	// upgrade, as Knative's CI runs knative.dev/pkg/test/upgrade.
	PreviousServingVersion = "v0.49.1"
)

// Substitutes are the modules serving version requires that the module
// proxy does not serve, each with the served version used in its place
// (module path -> version); nil for the pinned version. Serving v0.49.x
// requires knative.dev/caching v0.0.0-20260422140616-453ad996bbe2, which
// the proxy refuses (403, "not available"; it lists no caching versions),
// so the previous version's build and its image CRD take the caching
// version the pinned serving requires, the nearest one served. The build
// compiles serving's caching clients against it, so an incompatible API
// fails the build instead of passing silently.
func Substitutes(ctx context.Context, version string) (map[string]string, error) {
	if version != PreviousServingVersion {
		return nil, nil
	}
	pinned, err := PinnedVersions(ctx)
	if err != nil {
		return nil, err
	}
	v := pinned["knative.dev/caching"]
	if v == "" {
		return nil, fmt.Errorf("%s@%s does not require knative.dev/caching", ServingModule, ServingVersion)
	}
	return map[string]string{"knative.dev/caching": v}, nil
}

// Source is one YAML file in release order.
type Source struct {
	// Path is the file's place in upstream's config/core tree.
	Path string
	// Origin says where the bytes came from (module@version/path).
	Origin string
	Data   []byte
}

// symlinkedFiles are files that are symlinks in upstream's config/core and
// therefore missing from the module zip; each comes from the module that
// owns it, at the version serving pins.
var symlinkedFiles = []struct{ path, module, file string }{
	{"config/core/300-resources/certificate.yaml", "knative.dev/networking", "config/certificate.yaml"},
	{"config/core/300-resources/domain-claim.yaml", "knative.dev/networking", "config/domain-claim.yaml"},
	{"config/core/300-resources/ingress.yaml", "knative.dev/networking", "config/ingress.yaml"},
	{"config/core/300-resources/serverlessservice.yaml", "knative.dev/networking", "config/serverlessservice.yaml"},
	{"config/core/configmaps/network.yaml", "knative.dev/networking", "config/config-network.yaml"},
	{"config/core/300-imagecache.yaml", "knative.dev/caching", "config/image.yaml"},
}

// Sources lists config/core of the pinned serving module plus the symlinked
// files, sorted by path (ko's order).
func Sources(ctx context.Context) ([]Source, error) { return SourcesAt(ctx, ServingVersion) }

// SourcesAt is Sources for another version of the serving module: the
// operations suite installs stock Knative one minor version back and
// upgrades it to the pinned one, as Knative's own upgrade tests do.
func SourcesAt(ctx context.Context, version string) ([]Source, error) {
	serving, err := gobuild.Download(ctx, ServingModule, version)
	if err != nil {
		return nil, err
	}
	out, err := yamlTree(serving.Dir, ServingModule+"@"+version, "config/core")
	if err != nil {
		return nil, err
	}
	gomod, err := os.ReadFile(serving.GoMod)
	if err != nil {
		return nil, err
	}
	versions, err := requiredVersions(gomod)
	if err != nil {
		return nil, err
	}
	subst, err := Substitutes(ctx, version)
	if err != nil {
		return nil, err
	}
	for m, v := range subst {
		versions[m] = v
	}
	for _, f := range symlinkedFiles {
		v := versions[f.module]
		if v == "" {
			return nil, fmt.Errorf("%s@%s does not require %s", ServingModule, version, f.module)
		}
		mod, err := gobuild.Download(ctx, f.module, v)
		if err != nil {
			return nil, err
		}
		b, err := os.ReadFile(filepath.Join(mod.Dir, f.file))
		if err != nil {
			return nil, fmt.Errorf("%s (upstream symlink to %s@%s/%s): %w", f.path, f.module, v, f.file, err)
		}
		out = append(out, Source{Path: f.path, Origin: f.module + "@" + v + "/" + f.file, Data: b})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// PinnedVersions returns the module versions the pinned serving module
// requires (its go.mod): what another Knative component built alongside it
// must use, e.g. knative.dev/networking and knative.dev/pkg.
func PinnedVersions(ctx context.Context) (map[string]string, error) {
	serving, err := gobuild.Download(ctx, ServingModule, ServingVersion)
	if err != nil {
		return nil, err
	}
	gomod, err := os.ReadFile(serving.GoMod)
	if err != nil {
		return nil, err
	}
	return requiredVersions(gomod)
}

// yamlTree reads every .yaml file under tree (slash-separated, relative to
// the module's directory dir), each named by its path in the module and its
// origin module@version/path, in walk order.
func yamlTree(dir, moduleAtVersion, tree string) ([]Source, error) {
	var out []Source
	err := filepath.WalkDir(filepath.Join(dir, filepath.FromSlash(tree)), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		out = append(out, Source{Path: rel, Origin: moduleAtVersion + "/" + rel, Data: b})
		return nil
	})
	return out, err
}

func requiredVersions(gomod []byte) (map[string]string, error) {
	f, err := modfile.Parse("go.mod", gomod, nil)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, r := range f.Require {
		m[r.Mod.Path] = r.Mod.Version
	}
	return m, nil
}

// Object is one manifest with where it came from.
type Object struct {
	*unstructured.Unstructured
	Source string
}

// Parse splits every source into objects, skipping empty documents.
func Parse(sources []Source) ([]Object, error) {
	var out []Object
	for _, s := range sources {
		objs, err := manifest.Parse(s.Data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Origin, err)
		}
		for _, o := range objs {
			out = append(out, Object{Unstructured: o, Source: s.Path})
		}
	}
	return out, nil
}

// KoPrefix marks an image reference ko resolves at release time.
const KoPrefix = "ko://"

// KoReferences lists the distinct ko:// import paths in objs, sorted.
func KoReferences(objs []Object) []string {
	set := map[string]bool{}
	for _, o := range objs {
		walkStrings(o.Object, func(s string) string {
			if strings.HasPrefix(s, KoPrefix) {
				set[strings.TrimPrefix(s, KoPrefix)] = true
			}
			return s
		})
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// ResolveImages replaces every ko://IMPORTPATH string with images[IMPORTPATH]
// and fails naming each one left unresolved.
func ResolveImages(objs []Object, images map[string]string) error {
	var missing []string
	for _, o := range objs {
		walkStrings(o.Object, func(s string) string {
			if !strings.HasPrefix(s, KoPrefix) {
				return s
			}
			ref, ok := images[strings.TrimPrefix(s, KoPrefix)]
			if !ok {
				missing = append(missing, fmt.Sprintf("%s in %s %s (%s)", s, o.GetKind(), o.GetName(), o.Source))
				return s
			}
			return ref
		})
	}
	if len(missing) > 0 {
		return fmt.Errorf("unresolved image references: %s", strings.Join(missing, "; "))
	}
	return nil
}

func walkStrings(v any, fn func(string) string) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			t[k] = walkStrings(x, fn)
		}
	case []any:
		for i, x := range t {
			t[i] = walkStrings(x, fn)
		}
	case string:
		return fn(t)
	}
	return v
}
