package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/reconciler/revision/config"
)

const manifestDir = "../../config/controller"

// The installer builds the image from this path with ko-style tooling.
const koImage = "ko://lampyr.dev/serving/impl/cmd/controller"

type manifests struct {
	deployment     *appsv1.Deployment
	serviceAccount *corev1.ServiceAccount
	clusterRoles   map[string]*rbacv1.ClusterRole
	bindings       []*rbacv1.ClusterRoleBinding
	// roles are the namespaced Roles, by namespace/name.
	roles      map[string]*rbacv1.Role
	configMaps map[string]*corev1.ConfigMap
}

func loadManifests(t *testing.T) manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(manifestDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", manifestDir, err)
	}
	m := manifests{clusterRoles: map[string]*rbacv1.ClusterRole{}, roles: map[string]*rbacv1.Role{}, configMaps: map[string]*corev1.ConfigMap{}}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range bytes.Split(raw, []byte("\n---\n")) {
			var meta struct{ Kind string }
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			var into interface{}
			switch meta.Kind {
			case "Deployment":
				m.deployment = &appsv1.Deployment{}
				into = m.deployment
			case "ServiceAccount":
				m.serviceAccount = &corev1.ServiceAccount{}
				into = m.serviceAccount
			case "ClusterRole":
				into = &rbacv1.ClusterRole{}
			case "ClusterRoleBinding":
				into = &rbacv1.ClusterRoleBinding{}
			case "Role":
				into = &rbacv1.Role{}
			case "ConfigMap":
				into = &corev1.ConfigMap{}
			case "Namespace", "Service", "RoleBinding":
				continue
			default:
				t.Fatalf("%s: unexpected kind %q", f, meta.Kind)
			}
			if err := yaml.UnmarshalStrict(doc, into); err != nil {
				t.Fatalf("%s: %s: %v", f, meta.Kind, err)
			}
			switch o := into.(type) {
			case *rbacv1.ClusterRole:
				m.clusterRoles[o.Name] = o
			case *rbacv1.ClusterRoleBinding:
				m.bindings = append(m.bindings, o)
			case *rbacv1.Role:
				m.roles[o.Namespace+"/"+o.Name] = o
			case *corev1.ConfigMap:
				m.configMaps[o.Name] = o
			}
		}
	}
	return m
}

func TestManifestsDeployThisBinary(t *testing.T) {
	m := loadManifests(t)
	d := m.deployment
	if d == nil || m.serviceAccount == nil {
		t.Fatal("want a Deployment and a ServiceAccount")
	}
	if d.Namespace != "lampyr-system" || m.serviceAccount.Namespace != "lampyr-system" {
		t.Errorf("Deployment in %q, ServiceAccount in %q; want lampyr-system", d.Namespace, m.serviceAccount.Namespace)
	}
	if d.Spec.Template.Spec.ServiceAccountName != m.serviceAccount.Name {
		t.Errorf("Deployment runs as %q, ServiceAccount is %q", d.Spec.Template.Spec.ServiceAccountName, m.serviceAccount.Name)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if c.Image != koImage {
		t.Errorf("image %q, want %q", c.Image, koImage)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	// Upstream reconcilers read Knative's ConfigMaps from SYSTEM_NAMESPACE.
	if env["SYSTEM_NAMESPACE"].Value != "knative-serving" {
		t.Errorf("SYSTEM_NAMESPACE = %+v, want knative-serving", env["SYSTEM_NAMESPACE"])
	}
	if e := env[contract.SystemNamespaceEnv]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("%s = %+v, want the Pod's namespace", contract.SystemNamespaceEnv, e)
	}

	bound := false
	for _, b := range m.bindings {
		for _, s := range b.Subjects {
			if b.RoleRef.Name == "lampyr-controller" && s.Kind == "ServiceAccount" && s.Name == m.serviceAccount.Name && s.Namespace == m.serviceAccount.Namespace {
				bound = true
			}
		}
	}
	if !bound {
		t.Error("the lampyr-controller ClusterRole is not bound to the controller's ServiceAccount")
	}
}

func TestConfigLampyrParses(t *testing.T) {
	cm := loadManifests(t).configMaps[contract.ConfigMapName]
	if cm == nil || cm.Namespace != contract.SystemNamespace {
		t.Fatalf("want ConfigMap %s/%s, got %+v", contract.SystemNamespace, contract.ConfigMapName, cm)
	}
	l, err := config.NewLampyrFromConfigMap(cm)
	if err != nil {
		t.Fatal(err)
	}
	if l.BackendStrategy != lampyrconfig.BackendExternalName || l.VerifyArtifacts {
		t.Errorf("shipped config: %+v", l)
	}
}

func allows(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	has := func(list []string, v string) bool {
		for _, x := range list {
			if x == v || x == "*" {
				return true
			}
		}
		return false
	}
	for _, r := range rules {
		if !has(r.APIGroups, group) || !has(r.Verbs, verb) {
			continue
		}
		for _, res := range r.Resources {
			if res == resource || res == "*" || (strings.HasPrefix(res, "*/") && strings.HasSuffix(resource, res[1:])) {
				return true
			}
		}
	}
	return false
}

// TestRBACCoversWhatTheReconcilersDo lists what each reconciler in this
// binary reads and writes (from their controllers' informers and clients),
// cluster-wide or in one namespace, and checks the ClusterRole and the Roles
// grant exactly that scope: nothing about Secrets or ConfigMaps
// cluster-wide (docs/security.md §6).
func TestRBACCoversWhatTheReconcilersDo(t *testing.T) {
	m := loadManifests(t)
	role := m.clusterRoles["lampyr-controller"]
	if role == nil {
		t.Fatal("no lampyr-controller ClusterRole")
	}
	read := []string{"get", "list", "watch"}
	write := []string{"create", "update", "delete"}
	type need struct {
		group, resource string
		verbs           []string
		// namespace: "" cluster-wide, else the Role in that namespace.
		namespace string
	}
	needs := []need{
		// Lampyr Revision reconciler.
		{"serving.knative.dev", "revisions", read, ""},
		{"serving.knative.dev", "revisions/status", []string{"update"}, ""},
		{"serving.knative.dev", "revisions", []string{"patch"}, ""}, // finalizer
		{"serving.knative.dev", "revisions/finalizers", []string{"update"}, ""},
		{"fiberd.io", "capacitygrants", append(read, write...), ""},
		{"", "services", append(read, write...), ""},
		{"discovery.k8s.io", "endpointslices", append(read, write...), ""},
		// Router metadata and config-lampyr live in lampyr-system.
		{"", "configmaps", append(read, write...), "lampyr-system"},
		// Upstream: service, configuration, route, labeler, gc, domainmapping, nscert.
		{"serving.knative.dev", "services", append(read, write...), ""},
		{"serving.knative.dev", "configurations", append(read, write...), ""},
		{"serving.knative.dev", "routes", append(read, write...), ""},
		{"serving.knative.dev", "domainmappings", read, ""},
		{"serving.knative.dev", "domainmappings/status", []string{"update"}, ""},
		{"serving.knative.dev", "revisions", []string{"update", "delete"}, ""}, // labeler, gc
		{"networking.internal.knative.dev", "ingresses", append(read, write...), ""},
		{"networking.internal.knative.dev", "certificates", append(read, write...), ""},
		{"networking.internal.knative.dev", "clusterdomainclaims", append(read, write...), ""},
		{"", "endpoints", read, ""},
		{"", "namespaces", read, ""},
		{"", "events", []string{"create", "patch"}, ""},
		// Upstream's config watchers and leader election, in Knative's namespace.
		{"", "configmaps", read, "knative-serving"},
		{"coordination.k8s.io", "leases", append(read, write...), "knative-serving"},
		// certificate reconciler (when enabled).
		{"cert-manager.io", "certificates", append(read, write...), ""},
		{"acme.cert-manager.io", "challenges", read, ""},
	}
	for _, n := range needs {
		rules, where := role.Rules, "ClusterRole lampyr-controller"
		if n.namespace != "" {
			r := m.roles[n.namespace+"/lampyr-controller"]
			if r == nil {
				t.Errorf("no Role %s/lampyr-controller", n.namespace)
				continue
			}
			rules, where = r.Rules, "Role "+n.namespace+"/lampyr-controller"
		}
		for _, v := range n.verbs {
			if !allows(rules, n.group, n.resource, v) {
				t.Errorf("%s does not allow %s %s.%s", where, v, n.resource, n.group)
			}
		}
	}
	// Nothing Pod-based: Lampyr must not be able to create application Pods
	// or Deployments by accident; and no tenant's Secrets or ConfigMaps.
	for _, r := range []need{
		{"", "pods", []string{"create"}, ""}, {"apps", "deployments", []string{"create"}, ""},
		{"", "secrets", []string{"get", "list"}, ""}, {"", "configmaps", []string{"get", "list", "create"}, ""},
	} {
		for _, v := range r.verbs {
			if allows(role.Rules, r.group, r.resource, v) {
				t.Errorf("ClusterRole lampyr-controller allows %s %s cluster-wide", v, r.resource)
			}
		}
	}
	// Its only Secret is its own sealer key.
	sys := m.roles["lampyr-system/lampyr-controller"]
	for _, rule := range sys.Rules {
		for _, res := range rule.Resources {
			if res == "secrets" && (len(rule.ResourceNames) != 1 || rule.ResourceNames[0] != "lampyr-controller-sealer") {
				t.Errorf("Role lampyr-system/lampyr-controller grants secrets %v %v; want only get on lampyr-controller-sealer", rule.ResourceNames, rule.Verbs)
			}
		}
	}
}

func TestCertManagerOnlyWhenConfigured(t *testing.T) {
	if certManagerRequired(&corev1.ConfigMap{}) {
		t.Error("default config-network should not require cert-manager")
	}
}
