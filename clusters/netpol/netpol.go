// Package netpol installs the NetworkPolicy enforcer every framework cluster
// runs: kube-router's NetworkPolicy controller alone (iptables and ipset,
// built by clusters/inputs from github.com/cloudnativelabs/kube-router/v2),
// as a DaemonSet in kube-system whose image is preloaded into the node image
// and never pulled. The offline CNI (ptp, host-local, portmap) enforces no
// policy by itself.
package netpol

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"lampyr.dev/serving/impl/install/apply"
	"lampyr.dev/serving/impl/progress"
)

const (
	// Namespace and Name locate the DaemonSet (and its ServiceAccount,
	// ClusterRole and ClusterRoleBinding, of the same name).
	Namespace = "kube-system"
	Name      = "kube-router-netpol"
	// HealthPort serves /healthz and /readyz on the node's addresses
	// (kube-router's default health port).
	HealthPort = 20244
	// DefaultTimeout bounds the wait for the DaemonSet to be Ready.
	DefaultTimeout = 2 * time.Minute
)

// Options configure the enforcer for one cluster.
type Options struct {
	// Image is the enforcer's image as preloaded into the node's
	// containerd (inputs.Result.NetworkPolicyImage).
	Image string
	// Version is kube-router's version, for messages and a label.
	Version string
	// ServiceSubnet is the cluster's Service CIDR: kube-router lets
	// traffic to it through its INPUT chain.
	ServiceSubnet string
	// NodePortRange is the cluster's NodePort range, "30000-32767" when
	// empty (kubeadm's default).
	NodePortRange string
}

// Describe names what runs, for progress lines and errors.
func (o Options) Describe() string {
	return fmt.Sprintf("NetworkPolicy enforcer (DaemonSet %s/%s, kube-router %s)", Namespace, Name, o.Version)
}

// Objects are the enforcer's ServiceAccount, ClusterRole, ClusterRoleBinding
// and DaemonSet.
//
// Least privilege: the ClusterRole only reads what the controller reads
// (list and watch of pods, namespaces and networkpolicies for its informers;
// get of nodes, for its own node's addresses); no write verbs. The pod runs
// on the host network (it programs the node's iptables) as root with every
// capability dropped except NET_ADMIN and NET_RAW (iptables and ipset),
// no privilege escalation, a read-only root file system and the runtime's
// default seccomp profile. It shares /run/xtables.lock with kube-proxy.
func Objects(o Options) ([]*unstructured.Unstructured, error) {
	if o.Image == "" {
		return nil, fmt.Errorf("%s: no image (inputs did not build one)", o.Describe())
	}
	if o.ServiceSubnet == "" {
		return nil, fmt.Errorf("%s: no Service subnet", o.Describe())
	}
	if o.NodePortRange == "" {
		o.NodePortRange = "30000-32767"
	}
	labels := map[string]string{"app.kubernetes.io/name": Name, "app.kubernetes.io/component": "network-policy", "app.kubernetes.io/part-of": "lampyr-clusters"}
	meta := func(namespaced bool) metav1.ObjectMeta {
		m := metav1.ObjectMeta{Name: Name, Labels: labels}
		if namespaced {
			m.Namespace = Namespace
		}
		return m
	}
	sa := &corev1.ServiceAccount{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"}, ObjectMeta: meta(true)}
	role := &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: meta(false),
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
		ObjectMeta: meta(false),
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: Name, Namespace: Namespace}},
	}
	no, yes := false, true
	root := int64(0)
	fileOrCreate := corev1.HostPathFileOrCreate
	probe := func(path string) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt(HealthPort)}}}
	}
	readiness := probe("/readyz")
	readiness.PeriodSeconds = 2
	liveness := probe("/healthz")
	liveness.InitialDelaySeconds, liveness.PeriodSeconds, liveness.FailureThreshold = 60, 20, 3
	podLabels := map[string]string{"app.kubernetes.io/name": Name}
	ds := &appsv1.DaemonSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSet"},
		ObjectMeta: meta(true),
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: podLabels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: map[string]string{"lampyr.dev/kube-router-version": o.Version}},
				Spec: corev1.PodSpec{
					ServiceAccountName: Name,
					HostNetwork:        true,
					PriorityClassName:  "system-node-critical",
					Tolerations:        []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					SecurityContext:    &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
					Containers: []corev1.Container{{
						Name:  Name,
						Image: o.Image,
						// Preloaded into the node image; a pull could only fail.
						ImagePullPolicy: corev1.PullNever,
						Args: []string{
							"--service-cluster-ip-range=" + o.ServiceSubnet,
							"--service-node-port-range=" + o.NodePortRange,
							fmt.Sprintf("--health-port=%d", HealthPort),
						},
						Env: []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
						SecurityContext: &corev1.SecurityContext{
							RunAsUser:                &root,
							AllowPrivilegeEscalation: &no,
							ReadOnlyRootFilesystem:   &yes,
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_ADMIN", "NET_RAW"}},
						},
						ReadinessProbe: readiness,
						LivenessProbe:  liveness,
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
							corev1.ResourceCPU: resource.MustParse("20m"), corev1.ResourceMemory: resource.MustParse("32Mi"),
						}},
						VolumeMounts: []corev1.VolumeMount{{Name: "xtables-lock", MountPath: "/run/xtables.lock"}},
					}},
					Volumes: []corev1.Volume{{Name: "xtables-lock", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run/xtables.lock", Type: &fileOrCreate}}}},
				},
			},
		},
	}
	var out []*unstructured.Unstructured
	for _, obj := range []runtime.Object{sa, role, binding, ds} {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return nil, err
		}
		u := &unstructured.Unstructured{Object: m}
		unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
		unstructured.RemoveNestedField(u.Object, "spec", "template", "metadata", "creationTimestamp")
		unstructured.RemoveNestedField(u.Object, "status")
		out = append(out, u)
	}
	return out, nil
}

// Install applies the enforcer (server-side, idempotent) and waits for it to
// be Ready on every node: Ready means its first full sync is in the node's
// kernel, so policies are enforced from then on.
func Install(ctx context.Context, cfg *rest.Config, log *progress.Log, o Options, timeout time.Duration) error {
	objs, err := Objects(o)
	if err != nil {
		return err
	}
	a, err := apply.New(cfg, log)
	if err != nil {
		return err
	}
	if err := a.Apply(ctx, objs); err != nil {
		return fmt.Errorf("%s: %w", o.Describe(), err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return WaitReady(ctx, kube, o, timeout)
}

// WaitReady waits until the DaemonSet's current generation is rolled out and
// Ready on every node it schedules to; on timeout the error names the
// DaemonSet and what its pods are waiting for.
func WaitReady(ctx context.Context, kube kubernetes.Interface, o Options, timeout time.Duration) error {
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	var state string
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		ds, err := kube.AppsV1().DaemonSets(Namespace).Get(ctx, Name, metav1.GetOptions{})
		if err != nil {
			state = err.Error()
			return false, nil
		}
		s := ds.Status
		state = fmt.Sprintf("%d of %d pods ready, %d updated", s.NumberReady, s.DesiredNumberScheduled, s.UpdatedNumberScheduled)
		if s.ObservedGeneration < ds.Generation || s.DesiredNumberScheduled == 0 ||
			s.UpdatedNumberScheduled < s.DesiredNumberScheduled || s.NumberReady < s.DesiredNumberScheduled || s.NumberUnavailable > 0 {
			if why := podStates(ctx, kube); why != "" {
				state += "; " + why
			}
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%s not Ready after %s (%s): %w", o.Describe(), timeout, state, err)
	}
	return nil
}

// podStates summarizes why the enforcer's pods are not Ready.
func podStates(ctx context.Context, kube kubernetes.Interface) string {
	pods, err := kube.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + Name})
	if err != nil {
		return ""
	}
	var out []string
	for _, p := range pods.Items {
		var why []string
		for _, c := range p.Status.ContainerStatuses {
			switch {
			case c.State.Waiting != nil:
				why = append(why, strings.TrimSpace(c.State.Waiting.Reason+" "+c.State.Waiting.Message))
			case c.State.Terminated != nil:
				why = append(why, fmt.Sprintf("terminated: %s (exit %d)", c.State.Terminated.Reason, c.State.Terminated.ExitCode))
			case !c.Ready:
				why = append(why, fmt.Sprintf("running, not ready (restarts %d)", c.RestartCount))
			}
		}
		if len(p.Status.ContainerStatuses) == 0 {
			why = append(why, string(p.Status.Phase))
		}
		if len(why) > 0 {
			out = append(out, fmt.Sprintf("pod %s: %s", p.Name, strings.Join(why, ", ")))
		}
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}
