package ly

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"

	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/trust/seal"
)

const (
	labelService  = "serving.knative.dev/service"
	labelRevision = "serving.knative.dev/revision"
)

func readyOf(cs duckv1.Conditions) string {
	for _, c := range cs {
		if c.Type == apis.ConditionReady {
			if c.Status == "True" {
				return "True"
			}
			return fmt.Sprintf("%s %s", c.Status, c.Reason)
		}
	}
	return "Unknown"
}

// StatusReport is `ly status --output json`.
type StatusReport struct {
	Services []ServiceStatus `json:"services"`
}

// ServiceStatus is one Service with its Revisions and grants.
type ServiceStatus struct {
	Name      string           `json:"name"`
	Ready     string           `json:"ready"`
	URL       string           `json:"url"`
	Traffic   []string         `json:"traffic"`
	Revisions []RevisionStatus `json:"revisions"`
}

// RevisionStatus is one Revision and its CapacityGrant.
type RevisionStatus struct {
	Name     string `json:"name"`
	Ready    string `json:"ready"`
	Reason   string `json:"reason,omitempty"`
	Snapshot string `json:"snapshot"`
	Grant    string `json:"grant"`
	MaxScale string `json:"maxScale,omitempty"`
	Mode     string `json:"mode"`
}

// Status prints Services (all, or the named ones) with their Revisions,
// traffic and grants.
func Status(ctx context.Context, c *Cluster, ns string, names []string, w io.Writer, asJSON bool) error {
	list, err := c.Serving.ServingV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var rep StatusReport
	for _, s := range list.Items {
		if len(want) > 0 && !want[s.Name] {
			continue
		}
		delete(want, s.Name)
		ss := ServiceStatus{Name: s.Name, Ready: readyOf(s.Status.Conditions)}
		if s.Status.URL != nil {
			ss.URL = s.Status.URL.String()
		}
		for _, t := range s.Status.Traffic {
			label := t.RevisionName
			if t.Tag != "" {
				label += " (tag " + t.Tag + ")"
			}
			ss.Traffic = append(ss.Traffic, fmt.Sprintf("%s %d%%", label, ptrOr(t.Percent)))
		}
		revs, err := c.Serving.ServingV1().Revisions(ns).List(ctx, metav1.ListOptions{LabelSelector: labelService + "=" + s.Name})
		if err != nil {
			return err
		}
		sort.Slice(revs.Items, func(i, j int) bool { return revs.Items[i].Name < revs.Items[j].Name })
		for _, r := range revs.Items {
			rs := RevisionStatus{Name: r.Name, Ready: readyOf(r.Status.Conditions), Snapshot: r.Annotations[contract.SnapshotArtifactAnnotation], MaxScale: r.Annotations[AnnotationMaxScale], Mode: r.Annotations[contract.ExecutionModeAnnotation]}
			if rs.Mode == "" {
				rs.Mode = "fresh"
			}
			if c := r.Status.GetCondition(servingv1.RevisionConditionResourcesAvailable); c != nil && c.Status != "True" {
				rs.Reason = c.Reason + ": " + c.Message
			}
			rs.Grant = grantSummary(ctx, c, ns, r.Name)
			ss.Revisions = append(ss.Revisions, rs)
		}
		rep.Services = append(rep.Services, ss)
	}
	for n := range want {
		return fmt.Errorf("Service %s/%s not found", ns, n)
	}
	if asJSON {
		return json.NewEncoder(w).Encode(rep)
	}
	if len(rep.Services) == 0 {
		fmt.Fprintf(w, "no Services in namespace %s\n", ns)
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, s := range rep.Services {
		fmt.Fprintf(tw, "SERVICE %s\tready %s\t%s\n", s.Name, s.Ready, s.URL)
		fmt.Fprintf(tw, "  traffic\t%s\n", strings.Join(s.Traffic, ", "))
		for _, r := range s.Revisions {
			fmt.Fprintf(tw, "  revision %s\tready %s\tgrant %s\tmode %s\tmax-scale %s\n", r.Name, r.Ready, r.Grant, r.Mode, orDash(r.MaxScale))
			if r.Reason != "" {
				fmt.Fprintf(tw, "    \t%s\n", r.Reason)
			}
		}
	}
	return tw.Flush()
}

func ptrOr(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func grantSummary(ctx context.Context, c *Cluster, ns, name string) string {
	g, err := c.Dynamic.Resource(contract.CapacityGrants).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "none"
	}
	if err != nil {
		return "unreadable: " + err.Error()
	}
	cs, _, _ := unstructured.NestedSlice(g.Object, "status", "conditions")
	out := []string{}
	for _, t := range []string{"Admitted", "HomeReady", "Ready"} {
		for _, ci := range cs {
			cm, _ := ci.(map[string]any)
			if cm["type"] == t {
				s := fmt.Sprintf("%s=%v", t, cm["status"])
				if cm["status"] != "True" && cm["reason"] != nil {
					s += fmt.Sprintf("(%v)", cm["reason"])
				}
				out = append(out, s)
			}
		}
	}
	if len(out) == 0 {
		return "pending"
	}
	return strings.Join(out, ",")
}

// Scale sets the Service's max-scale. A new Revision follows, and each
// Revision needs its own sealed template, so Scale seals one for the next
// Revision from the snapshot's recorded helper facts and the current
// execution policy, signed by sealer. It returns the new Revision's name.
func Scale(ctx context.Context, c *Cluster, ns, name string, max int32, sealer *Sealer) (string, error) {
	if sealer == nil {
		return "", errors.New("scaling seals a template for the new Revision and needs a sealer identity (ly: --sealer-key, $" + SealerKeyEnv + " or ~/.config/lampyr/sealer.pem)")
	}
	svc, err := c.Serving.ServingV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("Service %s/%s: %w", ns, name, err)
	}
	ann := svc.Spec.Template.Annotations
	snap := ann[contract.SnapshotArtifactAnnotation]
	if snap == "" {
		return "", fmt.Errorf("Service %s/%s has no %s annotation: deploy it with ly deploy first", ns, name, contract.SnapshotArtifactAnnotation)
	}
	ref, err := artifact.ParseDigestRef(snap)
	if err != nil {
		return "", err
	}
	s, err := artifact.Fetch(ctx, snap)
	if err != nil {
		return "", registryErr(ref.RegistryStr(), "fetching "+snap, err)
	}
	inst, err := c.Describe(ctx)
	if err != nil {
		return "", err
	}
	rev, err := NextRevisionName(ctx, c, ns, name)
	if err != nil {
		return "", err
	}
	policy := seal.ExecutionPolicy{Mode: "fresh"}
	if ann[contract.ExecutionModeAnnotation] == "reuse" {
		d, err := time.ParseDuration(ann[contract.IdleTimeoutAnnotation])
		if err != nil {
			return "", fmt.Errorf("Service %s/%s annotation %s: %w", ns, name, contract.IdleTimeoutAnnotation, err)
		}
		policy = seal.ExecutionPolicy{Mode: "reuse", IdleTimeoutSeconds: int64((d + time.Second - 1) / time.Second), IdleAction: ann[contract.IdleActionAnnotation]}
	}
	tmpl, err := SealTemplate(ctx, inst, sealer.Key, ns, rev, ref, s.Config, policy)
	if err != nil {
		return "", err
	}
	patch := map[string]any{"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		AnnotationMaxScale:                strconv.Itoa(int(max)),
		contract.FiberdTemplateAnnotation: tmpl.String(),
	}}}}}
	body, _ := json.Marshal(patch)
	if _, err := c.Serving.ServingV1().Services(ns).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
		return "", err
	}
	return rev, nil
}

// revisionsOf lists a Service's Revision names.
func revisionsOf(ctx context.Context, c *Cluster, ns, name string) ([]string, error) {
	revs, err := c.Serving.ServingV1().Revisions(ns).List(ctx, metav1.ListOptions{LabelSelector: labelService + "=" + name})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range revs.Items {
		out = append(out, r.Name)
	}
	sort.Strings(out)
	return out, nil
}

// Logs prints the last lines of each Home (fiberd and the fibers' output)
// of the Service's Revisions.
func Logs(ctx context.Context, c *Cluster, ns, name string, tail int64, w io.Writer) error {
	revs, err := revisionsOf(ctx, c, ns, name)
	if err != nil {
		return err
	}
	if len(revs) == 0 {
		return fmt.Errorf("Service %s/%s has no Revisions", ns, name)
	}
	n := 0
	for _, r := range revs {
		pods, err := c.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: labelRevision + "=" + r})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			for _, ct := range p.Spec.Containers {
				n++
				fmt.Fprintf(w, "==> Revision %s, Home %s, container %s\n", r, p.Name, ct.Name)
				stream, err := c.Kube.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: ct.Name, TailLines: &tail, Timestamps: true}).Stream(ctx)
				if err != nil {
					fmt.Fprintf(w, "(logs unavailable: %v)\n", err)
					continue
				}
				sc := bufio.NewScanner(stream)
				sc.Buffer(make([]byte, 64*1024), 1024*1024)
				for sc.Scan() {
					fmt.Fprintln(w, sc.Text())
				}
				stream.Close()
			}
		}
	}
	if n == 0 {
		fmt.Fprintf(w, "no Home Pods for Revisions %s (a Revision gets a Home once its CapacityGrant is admitted)\n", strings.Join(revs, ", "))
	}
	return nil
}

// Events prints recent events of a Service and its children (Configuration,
// Route, Revisions, CapacityGrants, Homes), oldest first.
func Events(ctx context.Context, c *Cluster, ns, name string, w io.Writer) error {
	revs, err := revisionsOf(ctx, c, ns, name)
	if err != nil {
		return err
	}
	objs := map[string]bool{name: true}
	for _, r := range revs {
		objs[r] = true
	}
	evs, err := c.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var mine []corev1.Event
	for _, e := range evs.Items {
		n := e.InvolvedObject.Name
		if objs[n] || hasPrefixAny(n, revs) {
			mine = append(mine, e)
		}
	}
	sort.Slice(mine, func(i, j int) bool { return eventTime(mine[i]).Before(eventTime(mine[j])) })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LAST SEEN\tTYPE\tREASON\tOBJECT\tMESSAGE")
	for _, e := range mine {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s/%s\t%s\n", eventTime(e).Format(time.RFC3339), e.Type, e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message)
	}
	if len(mine) == 0 {
		fmt.Fprintf(tw, "(no events for Service %s/%s)\n", ns, name)
	}
	return tw.Flush()
}

func hasPrefixAny(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p+"-") {
			return true
		}
	}
	return false
}

func eventTime(e corev1.Event) time.Time {
	if !e.LastTimestamp.IsZero() {
		return e.LastTimestamp.Time
	}
	if !e.EventTime.IsZero() {
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// Delete deletes a Service and waits until its Revisions (and so their
// grants, Homes and backend Services) are gone.
func Delete(ctx context.Context, c *Cluster, ns, name string, timeout time.Duration) error {
	fg := metav1.DeletePropagationForeground
	if err := c.Serving.ServingV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
		return fmt.Errorf("Service %s/%s: %w", ns, name, err)
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		_, err := c.Serving.ServingV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		revs, rerr := revisionsOf(ctx, c, ns, name)
		if apierrors.IsNotFound(err) && rerr == nil && len(revs) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return fmt.Errorf("Service %s/%s still being deleted after %s: see ly event %s", ns, name, timeout, name)
}

// Audit prints what is deployed (Services, Revisions, digests, templates,
// grants) and returns how many inconsistencies it found: a Revision without
// a grant, a grant without a Revision, annotations that are missing or not
// digest-pinned, a Revision not Ready.
func Audit(ctx context.Context, c *Cluster, ns string, w io.Writer) (int, error) {
	revs, err := c.Serving.ServingV1().Revisions(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	grants, err := c.Dynamic.Resource(contract.CapacityGrants).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("listing CapacityGrants (is this a Lampyr installation?): %w", err)
	}
	grantOf := map[string]*unstructured.Unstructured{}
	for i := range grants.Items {
		grantOf[grants.Items[i].GetName()] = &grants.Items[i]
	}
	problems := 0
	bad := func(format string, a ...any) {
		problems++
		fmt.Fprintf(w, "  ! "+format+"\n", a...)
	}
	sort.Slice(revs.Items, func(i, j int) bool { return revs.Items[i].Name < revs.Items[j].Name })
	seen := map[string]bool{}
	for _, r := range revs.Items {
		seen[r.Name] = true
		snap, tmpl := r.Annotations[contract.SnapshotArtifactAnnotation], r.Annotations[contract.FiberdTemplateAnnotation]
		fmt.Fprintf(w, "Revision %s/%s (Service %s): ready %s\n  snapshot %s\n  template %s\n  grant    %s\n", ns, r.Name, r.Labels[labelService], readyOf(r.Status.Conditions), orDash(snap), orDash(tmpl), grantSummary(ctx, c, ns, r.Name))
		if _, err := artifact.ParseDigestRef(snap); err != nil {
			bad("snapshot artifact annotation missing or not digest-pinned")
		}
		if _, err := artifact.ParseDigestRef(tmpl); err != nil {
			bad("fiberd template annotation missing or not digest-pinned")
		}
		g := grantOf[r.Name]
		if g == nil && r.IsReady() {
			bad("Ready without a CapacityGrant")
		}
		if g != nil {
			gs, _, _ := unstructured.NestedString(g.Object, "spec", "snapshotArtifact")
			if gs != snap {
				bad("grant snapshot %s differs from the Revision's", gs)
			}
		}
		if !r.IsReady() {
			bad("not Ready: %s", readyOf(r.Status.Conditions))
		}
	}
	for n := range grantOf {
		if !seen[n] {
			fmt.Fprintf(w, "CapacityGrant %s/%s\n", ns, n)
			bad("no Revision %s: an orphaned grant", n)
		}
	}
	if problems == 0 {
		fmt.Fprintf(w, "%d Revisions, %d grants: consistent\n", len(revs.Items), len(grants.Items))
	}
	return problems, nil
}
