package netpol

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

var opts = Options{Image: "lampyr.dev/kube-router-netpol:2.1.0-0123456789ab", Version: "v2.1.0", ServiceSubnet: "10.96.0.0/16"}

func objects(t *testing.T) (*rbacv1.ClusterRole, *appsv1.DaemonSet) {
	t.Helper()
	objs, err := Objects(opts)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	var role rbacv1.ClusterRole
	var ds appsv1.DaemonSet
	for _, o := range objs {
		kinds = append(kinds, o.GetKind())
		if o.GetName() != Name {
			t.Errorf("%s is named %s, want %s", o.GetKind(), o.GetName(), Name)
		}
		switch o.GetKind() {
		case "ClusterRole":
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role); err != nil {
				t.Fatal(err)
			}
		case "DaemonSet":
			if o.GetNamespace() != "kube-system" {
				t.Errorf("DaemonSet in %q, want kube-system", o.GetNamespace())
			}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ds); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !slices.Equal(kinds, []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"}) {
		t.Fatalf("objects %v", kinds)
	}
	return &role, &ds
}

// The enforcer may read what its informers and node lookup read, nothing
// more, and write nothing.
func TestRBACIsReadOnlyAndMinimal(t *testing.T) {
	role, _ := objects(t)
	got := map[string][]string{}
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			got[res] = append(got[res], r.Verbs...)
		}
		for _, v := range r.Verbs {
			if !slices.Contains([]string{"get", "list", "watch"}, v) {
				t.Errorf("verb %s on %v: the enforcer writes nothing to the API", v, r.Resources)
			}
		}
	}
	want := map[string][]string{"pods": {"list", "watch"}, "namespaces": {"list", "watch"}, "networkpolicies": {"list", "watch"}, "nodes": {"get"}}
	for res, verbs := range want {
		if !slices.Equal(got[res], verbs) {
			t.Errorf("%s: verbs %v, want %v", res, got[res], verbs)
		}
	}
	if len(got) != len(want) {
		t.Errorf("resources %v, want only %v", got, want)
	}
}

func TestDaemonSetNeverPullsAndDropsPrivilege(t *testing.T) {
	_, ds := objects(t)
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("the enforcer programs the node's iptables: it needs the host network")
	}
	c := spec.Containers[0]
	if c.Image != opts.Image || c.ImagePullPolicy != corev1.PullNever {
		t.Errorf("image %s pull %s: want the preloaded image, never pulled", c.Image, c.ImagePullPolicy)
	}
	sc := c.SecurityContext
	if sc == nil || sc.Privileged != nil && *sc.Privileged {
		t.Fatal("the enforcer must not be privileged")
	}
	if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_ADMIN", "NET_RAW"}) {
		t.Errorf("capabilities %+v, want all dropped but NET_ADMIN and NET_RAW", sc.Capabilities)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("want no privilege escalation and a read-only root file system")
	}
	args := strings.Join(c.Args, " ")
	if !strings.Contains(args, "--service-cluster-ip-range=10.96.0.0/16") || !strings.Contains(args, "--service-node-port-range=30000-32767") {
		t.Errorf("args %s", args)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Error("readiness must wait for the first sync (/readyz)")
	}
	if _, err := Objects(Options{ServiceSubnet: "10.96.0.0/16", Version: "v2.1.0"}); err == nil || !strings.Contains(err.Error(), "kube-router-netpol") {
		t.Errorf("no image: want an error naming the DaemonSet, got %v", err)
	}
}

func TestWaitReadyNamesWhatItWaitedFor(t *testing.T) {
	kube := fake.NewClientset(
		&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: Name, Namespace: Namespace, Generation: 1},
			Status: appsv1.DaemonSetStatus{ObservedGeneration: 1, DesiredNumberScheduled: 1, UpdatedNumberScheduled: 1, NumberUnavailable: 1}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: Name + "-x", Namespace: Namespace, Labels: map[string]string{"app.kubernetes.io/name": Name}},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImageNeverPull"}}}}}},
	)
	err := WaitReady(context.Background(), kube, opts, 1500*time.Millisecond)
	if err == nil {
		t.Fatal("an unready DaemonSet must time out")
	}
	for _, want := range []string{"kube-system/kube-router-netpol", "kube-router v2.1.0", "0 of 1 pods ready", "ErrImageNeverPull", "1.5s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	ds, _ := kube.AppsV1().DaemonSets(Namespace).Get(context.Background(), Name, metav1.GetOptions{})
	ds.Status.NumberReady, ds.Status.NumberUnavailable = 1, 0
	if _, err := kube.AppsV1().DaemonSets(Namespace).UpdateStatus(context.Background(), ds, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := WaitReady(context.Background(), kube, opts, 3*time.Second); err != nil {
		t.Errorf("a ready DaemonSet: %v", err)
	}
}
