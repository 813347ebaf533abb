package tenancy

// The fiber rows on a Lampyr whose Homes run fibers on the gvisor backend
// (config-lampyr fiber-backend: gvisor, issue 35). There the handler's
// system calls are served by gVisor's kernel (the Sentry), not the
// host's: unshare, keyctl, a ping socket or ptrace of its own child
// succeed inside that kernel, and the handler is PID 1 of it. What such a
// row must show is what reaches the host: the probe was answered by
// gVisor's kernel, and on the node every Sentry and gofer is an
// unprivileged host user of an id range of its own, with no_new_privs and
// a seccomp filter. docs/security.md §8 says which rows change and why.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
)

// variant is a row's expectation and attempt on one fiber backend.
type variant struct {
	expected string
	run      func(ctx context.Context, s *side) (string, bool)
}

// on is a as it runs against a Lampyr whose fibers run on backend.
func (a attack) on(backend string) attack {
	if backend == lampyrconfig.BackendGVisor && a.onGVisor != nil {
		a.expected, a.run = a.onGVisor.expected+" [gvisor backend]", a.onGVisor.run
	}
	return a
}

// fiberBackend is config-lampyr's fiber-backend (default process).
func fiberBackend(ctx context.Context, s *side) string {
	cm, err := s.admin.Kube.CoreV1().ConfigMaps(contract.SystemNamespace).Get(ctx, contract.ConfigMapName, metav1.GetOptions{})
	must(err, "reading config-lampyr")
	if b := cm.Data[lampyrconfig.KeyFiberBackend]; b != "" {
		return b
	}
	return lampyrconfig.BackendProcess
}

// sentry is one runsc-sandbox or runsc-gofer process on the node.
type sentry struct {
	pid, role, uid, noNewPrivs, seccomp, uidMap, pod string
}

var podInCgroup = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

// nodeSentries lists every gVisor sandbox and gofer process on the Lampyr
// cluster's node, as the node's root sees them (docker exec into the Kind
// node container).
func nodeSentries(ctx context.Context, s *side) []sentry {
	const script = `for d in /proc/[0-9]*; do
  a=$(tr '\0' ' ' < $d/cmdline 2>/dev/null)
  case "$a" in runsc-sandbox*|runsc-gofer*) ;; *) continue;; esac
  echo "== ${d#/proc/} ${a%% *}"
  grep -E '^(Uid|NoNewPrivs|Seccomp):' $d/status
  echo "uid_map: $(head -n1 $d/uid_map)"
  echo "cgroup: $(tr '\n' ' ' < $d/cgroup)"
done`
	out := nodeShell(ctx, s, script)
	var all []sentry
	var cur *sentry
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 3 && f[0] == "==":
			all = append(all, sentry{pid: f[1], role: f[2]})
			cur = &all[len(all)-1]
		case cur == nil || len(f) < 2:
		case f[0] == "Uid:":
			cur.uid = f[1]
		case f[0] == "NoNewPrivs:":
			cur.noNewPrivs = f[1]
		case f[0] == "Seccomp:":
			cur.seccomp = f[1]
		case f[0] == "uid_map:":
			cur.uidMap = strings.Join(f[1:], " ")
		case f[0] == "cgroup:":
			if m := podInCgroup.FindStringSubmatch(l); m != nil {
				cur.pod = strings.ReplaceAll(m[1], "_", "-")
			}
		}
	}
	return all
}

// sentriesConfined judges every Sentry and gofer on the node (each must be
// an unprivileged host user, with no_new_privs and a seccomp filter, and
// no two sandboxes may share a host uid) and says how many belong to each
// tenant's evil Home; need names tenants that must have at least one.
//
// A sandbox that is still booting (a pool refill) has not yet installed
// its seccomp filter and no_new_privs, and runs no tenant code yet: a
// process is judged unconfined only if it still is on two more reads 2 s
// apart (a Sentry serving a handler never drops its filter).
func sentriesConfined(ctx context.Context, s *side, need ...*tenant) (string, bool) {
	all := nodeSentries(ctx, s)
	unconfined := func(p sentry) bool {
		return p.uid == "" || p.uid == "0" || p.uidMap == "0 0 4294967295" || p.noNewPrivs != "1" || p.seccomp != "2"
	}
	suspect := map[string]sentry{}
	for _, p := range all {
		if unconfined(p) {
			suspect[p.pid] = p
		}
	}
	booting := 0
	for i := 0; i < 2 && len(suspect) > 0; i++ {
		time.Sleep(2 * time.Second)
		still := map[string]sentry{}
		for _, p := range nodeSentries(ctx, s) {
			if _, ok := suspect[p.pid]; ok && unconfined(p) {
				still[p.pid] = p
			}
		}
		booting += len(suspect) - len(still)
		suspect = still
	}
	homes := map[string]string{} // Pod UID -> tenant namespace
	for _, t := range s.tenants() {
		pods, err := e2eutil.HomePods(ctx, s.admin, t.ns, evilRev)
		must(err, "finding "+t.ns+"'s evil Home")
		for _, p := range pods.Items {
			homes[string(p.UID)] = t.ns
		}
	}
	ok := len(all) > 0
	var bad []string
	perTenant := map[string]int{}
	uidOf := map[string]string{} // host uid -> a sandbox holding it
	for _, p := range all {
		if _, bad0 := suspect[p.pid]; bad0 {
			ok = false
			bad = append(bad, fmt.Sprintf("%s %s: uid %q, uid_map %q, NoNewPrivs %q, Seccomp %q", p.role, p.pid, p.uid, p.uidMap, p.noNewPrivs, p.seccomp))
		}
		if p.role != "runsc-sandbox" {
			continue
		}
		if other, dup := uidOf[p.uid]; dup {
			ok = false
			bad = append(bad, fmt.Sprintf("sandboxes %s and %s share host uid %s", other, p.pid, p.uid))
		}
		uidOf[p.uid] = p.pid
		if ns := homes[p.pod]; ns != "" {
			perTenant[ns]++
		}
	}
	for _, t := range need {
		if perTenant[t.ns] == 0 {
			ok = false
			bad = append(bad, "no sandbox of "+t.ns+"'s evil Home found")
		}
	}
	sb := 0
	for _, p := range all {
		if p.role == "runsc-sandbox" {
			sb++
		}
	}
	var per []string
	for ns, n := range perTenant {
		per = append(per, fmt.Sprintf("%s %d", ns, n))
	}
	sort.Strings(per)
	obs := fmt.Sprintf("node: %d sandboxes (%s), %d Sentry/gofer processes", sb, strings.Join(per, ", "), len(all))
	if booting > 0 {
		obs += fmt.Sprintf(" (%d still booting at the first read, confined at a later one)", booting)
	}
	if ok {
		obs += ", each an unprivileged host uid of its own range, NoNewPrivs 1, Seccomp 2"
	} else if len(bad) > 0 {
		obs += "; " + strings.Join(bad, "; ")
	}
	return obs, ok
}

// keepFibers holds one fiber of each tenant's evil Service for the
// duration of a node check (fresh fibers end with their request).
func keepFibers(ctx context.Context, s *side) func() {
	var stops []func()
	for _, t := range s.tenants() {
		_, stop := stream(ctx, s, t, "/hold?what=inotify&n=1&ms=60000")
		stops = append(stops, stop)
	}
	return func() {
		for _, stop := range stops {
			stop()
		}
	}
}

// underGVisor says whether a probe was answered by gVisor's kernel.
func underGVisor(p evilProbe) (string, bool) {
	k, _ := p.Details["kernel"].(string)
	return k, strings.Contains(k, "gvisor")
}

// everyFiberGVisor: F1 on gvisor. Inside, each fiber's handler and child
// hold no capability and are not root of gVisor's kernel; on the node,
// every Sentry and gofer is confined (sentriesConfined).
func everyFiberGVisor(ctx context.Context, s *side) (string, bool) {
	n, bad := askEveryFiber(ctx, s, func(p evilProbe) string {
		var why []string
		if k, ok := underGVisor(p); !ok {
			why = append(why, fmt.Sprintf("kernel %q, not gVisor's", k))
		}
		if strings.Contains(p.Result, "holds capabilities") || strings.Contains(p.Result, "runs as root") {
			why = append(why, p.Result)
		}
		return strings.Join(why, "; ")
	})
	stop := keepFibers(ctx, s)
	node, ok := sentriesConfined(ctx, s, s.a, s.b)
	stop()
	obs := fmt.Sprintf("%d/24 fibers (and a child of each) under gVisor's kernel, CapEff 0, not root; %s", n, node)
	if len(bad) > 0 {
		obs += "; " + strings.Join(bad, "; ")
	}
	return obs, ok && n == 24 && len(bad) == 0
}

// inGVisor: a row whose system calls gVisor's kernel serves. The probe's
// own verdict (about the kernel it ran on) is reported; the row holds if
// that kernel was gVisor's and every Sentry on the node stayed confined.
func inGVisor(path string) func(ctx context.Context, s *side) (string, bool) {
	return func(ctx context.Context, s *side) (string, bool) {
		code, p, body := evilGet(ctx, s, s.a, path)
		if code != http.StatusOK {
			return fmt.Sprintf("%d %s", code, short(body, 200)), false
		}
		k, gv := underGVisor(p)
		stop := keepFibers(ctx, s)
		node, ok := sentriesConfined(ctx, s, s.a)
		stop()
		return fmt.Sprintf("answered by kernel %s: %s; %s", k, p.Result, node), gv && ok
	}
}

// holdAcrossGVisor: F3 on gvisor. Each fiber is its own kernel, so per-user
// counts inside are per fiber; on the host, A's and B's Sentries are
// different unprivileged users. A's fiber may die holding processes (each
// guest process costs the Sentry ~4 MiB of host memory under systrap, so
// the fiber's memory limit ends it first): that is reported, and B must
// still take 8 of 8.
func holdAcrossGVisor(what string) func(ctx context.Context, s *side) (string, bool) {
	return func(ctx context.Context, s *side) (string, bool) {
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		req, err := http.NewRequestWithContext(rctx, http.MethodGet, s.gateway+"/hold?what="+what+"&ms=60000", nil)
		must(err, "request")
		req.Host = host(evilSvc, nsA)
		held := "A's fiber: "
		if resp, err := http.DefaultClient.Do(req); err != nil {
			held += err.Error()
		} else {
			defer func() { io.Copy(io.Discard, resp.Body); resp.Body.Close() }()
			line, _ := bufio.NewReader(resp.Body).ReadString('\n')
			var p evilProbe
			if resp.StatusCode == http.StatusOK && json.Unmarshal([]byte(line), &p) == nil {
				held += p.Result
			} else {
				held += fmt.Sprintf("%d %s (its sandbox ended)", resp.StatusCode, short(line, 120))
			}
		}
		_, took, _ := evilGet(ctx, s, s.b, "/take?what="+what+"&n=8")
		stop := keepFibers(ctx, s)
		node, ok := sentriesConfined(ctx, s, s.a, s.b)
		stop()
		return fmt.Sprintf("%s; B %s; %s", held, took.Result, node), !took.Escaped && ok
	}
}

// nodeShell runs script in the Lampyr cluster's (only) Kind node.
func nodeShell(ctx context.Context, s *side, script string) string {
	nodes, err := s.admin.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	must(err, "listing nodes")
	if len(nodes.Items) != 1 {
		abortf("the gvisor rows read the node and expect one Kind node, found %d", len(nodes.Items))
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, "docker", "exec", nodes.Items[0].Name, "sh", "-c", script).CombinedOutput()
	if err != nil {
		abortf("docker exec %s: %v: %s", nodes.Items[0].Name, err, short(string(out), 300))
	}
	return string(out)
}

// podCgroupFind is a shell fragment setting d to Pod uid's cgroup
// directory of controller (cgroup v1: cpu and cpuacct may be mounted
// apart) on the node, cgroupfs or systemd naming.
func podCgroupFind(controller, uid string) string {
	if uid == "" {
		abortf("a Home Pod without a UID")
	}
	return fmt.Sprintf(`d=$(find /sys/fs/cgroup/%s/ -maxdepth 6 -type d \( -name '*pod%s*' -o -name '*pod%s*' \) | head -n1)`, controller, uid, strings.ReplaceAll(uid, "-", "_"))
}

// homeCPUSeconds is the CPU the host charged to A's Home Pods so far.
func homeCPUSeconds(ctx context.Context, s *side, homes []corev1.Pod) float64 {
	total := 0.0
	for _, p := range homes {
		out := strings.TrimSpace(nodeShell(ctx, s, podCgroupFind("cpuacct", string(p.UID))+`; [ -n "$d" ] && cat "$d/cpuacct.usage"`))
		ns, err := strconv.ParseFloat(out, 64)
		if err != nil {
			abortf("reading Home %s's cpuacct.usage on the node: %q", p.Name, out)
		}
		total += ns / 1e9
	}
	return total
}

// sandboxCPUQuotas are the CPU bounds (quota/period) the host holds each of
// the Homes' gVisor sandboxes to (their cgroups under the Pod's).
func sandboxCPUQuotas(ctx context.Context, s *side, homes []corev1.Pod) []float64 {
	var qs []float64
	for _, p := range homes {
		out := nodeShell(ctx, s, podCgroupFind("cpu", string(p.UID))+`; [ -n "$d" ] || exit 0; for q in $(find "$d"/ -path '*fibers-gvisor/*/cpu.cfs_quota_us'); do echo "$(cat $q) $(cat ${q%quota_us}period_us)"; done`)
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var q, per float64
			if _, err := fmt.Sscan(l, &q, &per); err == nil && per > 0 {
				if q < 0 {
					q = per * 1000 // unbounded: fails any bound
				}
				qs = append(qs, q/per)
			}
		}
	}
	return qs
}
