package tenancy

// Plain tests of the suite's own logic: they run with `go test` whether or
// not LAMPYR_E2E is set, so a broken verdict is caught without a cluster.

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/fake"

	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
)

func TestClassify(t *testing.T) {
	for in, want := range map[string]string{
		`timeout after 5s: Get "http://10.244.0.7/": context deadline exceeded`:                "timeout after 5s",
		`Get "http://10.244.0.7:9090/": dial tcp 10.244.0.7:9090: connect: connection refused`: "connection refused",
		`dial tcp 10.244.0.7:80: connect: no route to host`:                                    "no route to host",
		`Get "http://x/": read: connection reset by peer`:                                      "connection reset",
		`dial tcp: lookup fiber-router.lampyr-system.svc.cluster.local: no such host`:          "no such host",
		"": "no answer",
	} {
		if got := classify(in); got != want {
			t.Errorf("classify(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSummarize(t *testing.T) {
	silent := []probeResult{
		{probe: probe{target: "fiber-router Service"}, Error: "timeout after 5s: context deadline exceeded"},
		{probe: probe{target: "10.0.0.1:80"}, Error: "timeout after 5s: i/o timeout"},
		{probe: probe{target: "10.0.0.1:81"}, Error: "dial tcp: connection refused"},
	}
	obs, none := summarize(silent)
	if !none {
		t.Fatalf("no probe answered, but summarize says one did: %s", obs)
	}
	if obs != "connection refused (10.0.0.1:81); timeout after 5s (fiber-router Service, 10.0.0.1:80)" {
		t.Errorf("observed %q", obs)
	}
	// Any HTTP answer is a reach, even an error status: something behind
	// the port listened to the attacker.
	for _, status := range []int{200, 401, 404, 503} {
		rs := append([]probeResult{{probe: probe{target: "10.0.0.2:9090"}, Status: status, Body: "Hello World!\n"}}, silent...)
		obs, none := summarize(rs)
		if none {
			t.Errorf("status %d: summarize says nothing answered (%s)", status, obs)
		}
		if !strings.HasPrefix(obs, "10.0.0.2:9090 → ") || !strings.Contains(obs, "no answer: ") {
			t.Errorf("status %d: observed %q", status, obs)
		}
	}
}

func TestLampyrMaterial(t *testing.T) {
	fleet := []byte("-----BEGIN LAMPYR FLEET PRIVATE KEY-----\nAAAA\n-----END LAMPYR FLEET PRIVATE KEY-----\n")
	pkcs8 := []byte("-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEI\n-----END PRIVATE KEY-----\n")
	needle := []byte("MC4CAQAwBQYDK2VwBCIEI")
	for _, tc := range []struct {
		key     string
		value   []byte
		generic bool
		needles [][]byte
		found   bool
	}{
		{"private.pem", fleet, false, nil, true},
		{"token", []byte("Bearer lyrc1.eyJhdWQiOiJ4In0.c2ln"), false, nil, true},
		{"router-token", []byte("x"), false, nil, true},
		{"grant.jwt", []byte("x"), false, nil, true},
		{"tls.key", pkcs8, true, nil, true},   // in a tenant namespace: any private key is suspect
		{"tls.key", pkcs8, false, nil, false}, // cluster-wide: webhooks keep theirs
		{"copy", append([]byte("prefix "), needle...), false, [][]byte{needle}, true},
		{"ca.crt", []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), true, nil, false},
		{"homeEndpoint", []byte("10.0.0.1:8080"), true, nil, false},
	} {
		if got := lampyrMaterial(tc.key, tc.value, tc.generic, tc.needles); (got != "") != tc.found {
			t.Errorf("lampyrMaterial(%q, %.20q, generic=%t) = %q, want found=%t", tc.key, tc.value, tc.generic, got, tc.found)
		}
	}
}

func TestPublicOnly(t *testing.T) {
	pub := "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n-----BEGIN LAMPYR FLEET PUBLIC KEY-----\nAA\n-----END LAMPYR FLEET PUBLIC KEY-----\n"
	if !publicOnly([]byte(pub)) {
		t.Error("public keys are published on purpose")
	}
	if publicOnly([]byte(pub + "-----BEGIN PRIVATE KEY-----\nAA\n-----END PRIVATE KEY-----\n")) {
		t.Error("a PEM with a private key is not public")
	}
	if publicOnly([]byte("raw secret bytes")) {
		t.Error("raw bytes are not known to be public")
	}
}

func TestReportCells(t *testing.T) {
	refused := result{attack: attack{name: "5 x", appliesTo: onBoth, expected: "no answer"},
		lampyr: outcome{ran: true, refused: true, observed: "timeout after 5s (a | b)"},
		stock:  outcome{ran: true, refused: false, observed: "200 \"Hello tenancy-b!\""}}
	escaped := result{attack: attack{name: "8 y", appliesTo: onLampyr, expected: "0 seen"},
		lampyr: outcome{ran: true, refused: false, observed: "forged Home saw 3"}}
	failedControl := result{attack: attack{name: "7d", appliesTo: onLampyr, control: true, expected: "200"},
		lampyr: outcome{ran: true, refused: true, observed: "503"}}
	notRun := result{attack: attack{name: "6a", appliesTo: onBoth}, lampyr: outcome{ran: true, err: "control failed"}, stock: outcome{ran: true, err: "boom"}}

	if got := refused.lampyrCell(); got != "refused: timeout after 5s (a | b)" {
		t.Errorf("lampyr cell %q", got)
	}
	if got := refused.stockCell(); !strings.HasPrefix(got, "reached: no defence in stock Knative") {
		t.Errorf("stock cell %q", got)
	}
	if got := escaped.lampyrCell(); !strings.HasPrefix(got, "ESCAPED") {
		t.Errorf("escaped cell %q", got)
	}
	if got := escaped.stockCell(); got != "n/a" {
		t.Errorf("stock cell of a Lampyr-only attack %q", got)
	}
	if got := failedControl.lampyrCell(); !strings.HasPrefix(got, "CONTROL FAILED") {
		t.Errorf("control cell %q", got)
	}
	if got := notRun.stockCell(); got != "not run: boom" {
		t.Errorf("not-run cell %q", got)
	}

	md := renderReport([]string{"header"}, []result{refused, escaped, failedControl, notRun})
	if !strings.Contains(md, `(a \| b)`) {
		t.Errorf("a | in a cell is not escaped:\n%s", md)
	}
	if !strings.Contains(md, "4 rows; on Lampyr 2 not refused (or control failed, or parity failed), 1 not run.") {
		t.Errorf("summary line wrong:\n%s", md)
	}
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(l, "| ") && strings.Count(strings.ReplaceAll(l, `\|`, ""), "|") != 5 {
			t.Errorf("row with the wrong number of cells: %s", l)
		}
	}
}

// A parity row fails when the sides disagree, and only when stock ran.
func TestParityCells(t *testing.T) {
	row := attack{name: "G1a quota", appliesTo: onBoth, parity: true, expected: "2 Ready", withoutDefence: "all 6\nReady"}
	same := result{attack: row,
		lampyr: outcome{ran: true, refused: true, verdict: "Ready: q-1, q-2", observed: "2 Ready"},
		stock:  outcome{ran: true, refused: true, verdict: "Ready: q-1, q-2", observed: "2 Ready"}}
	if differs, why := same.parityDiffers(); differs {
		t.Errorf("same verdicts differ: %s", why)
	}
	if got := same.lampyrCell(); got != "refused: 2 Ready" {
		t.Errorf("lampyr cell %q", got)
	}
	other := same
	other.stock.verdict = "Ready: q-1, q-2, q-3"
	differs, why := other.parityDiffers()
	if !differs || why != "Lampyr Ready: q-1, q-2, stock Ready: q-1, q-2, q-3" {
		t.Errorf("parityDiffers = %t %q", differs, why)
	}
	if got := other.lampyrCell(); !strings.HasPrefix(got, "PARITY FAILED (") {
		t.Errorf("lampyr cell %q", got)
	}
	// Without a verdict, refused is compared.
	plain := result{attack: row, lampyr: outcome{ran: true, refused: true}, stock: outcome{ran: true, refused: false}}
	if differs, _ := plain.parityDiffers(); !differs {
		t.Error("refused on Lampyr, reached on stock: want a parity failure")
	}
	// A stock side that did not run compares nothing.
	noStock := other
	noStock.stock = outcome{ran: true, err: "stock not set up"}
	if differs, _ := noStock.parityDiffers(); differs {
		t.Error("a stock side that did not run made a parity failure")
	}
	// Not a parity row: a difference is only reported.
	ref := other
	ref.parity = false
	if differs, _ := ref.parityDiffers(); differs {
		t.Error("a reference row made a parity failure")
	}
	md := renderReport(nil, []result{same, other})
	if !strings.Contains(md, "2 rows; on Lampyr 1 not refused (or control failed, or parity failed), 0 not run.") {
		t.Errorf("summary line wrong:\n%s", md)
	}
	if !strings.Contains(md, "- **G1a**: all 6 Ready") {
		t.Errorf("no line on how the row fails without its defence:\n%s", md)
	}
}

func TestAttacksAreWellFormed(t *testing.T) {
	seen := map[string]bool{}
	for _, a := range append(append(append([]attack{}, attacks...), fiberAttacks...), guardRails...) {
		if a.name == "" || a.expected == "" || (a.run == nil) == (a.runParity == nil) || a.appliesTo&onLampyr == 0 {
			t.Errorf("attack %q: every attack has a name, an expectation, one run func and applies to Lampyr", a.name)
		}
		if v := a.onGVisor; v != nil && (v.expected == "" || v.run == nil || a.runParity != nil) {
			t.Errorf("attack %q: a gvisor variant has an expectation and a run func (and is not a parity row)", a.name)
		}
		if g := a.on(lampyrconfig.BackendGVisor); a.onGVisor == nil && g.expected != a.expected {
			t.Errorf("attack %q: changed on gvisor without a variant", a.name)
		} else if a.onGVisor != nil && (!strings.Contains(g.expected, "[gvisor backend]") || a.on(lampyrconfig.BackendProcess).expected != a.expected) {
			t.Errorf("attack %q: the gvisor variant must replace the row on gvisor only, and say so", a.name)
		}
		if a.runParity != nil && !a.parity {
			t.Errorf("attack %q: runParity is for parity rows", a.name)
		}
		if a.parity && a.appliesTo&onStock == 0 {
			t.Errorf("attack %q: a parity row must run on stock", a.name)
		}
		for _, l := range a.labels(false) {
			if strings.ContainsAny(l, "&|!,()/ ") {
				t.Errorf("attack %q: label %q is not a valid Ginkgo label", a.name, l)
			}
		}
		if seen[a.name] {
			t.Errorf("attack %q declared twice (Its are named after attacks)", a.name)
		}
		seen[a.name] = true
	}
	for _, a := range guardRails {
		if a.withoutDefence == "" || !slices.Contains(a.tags, "guardrails") {
			t.Errorf("guard-rail row %q: says how it fails without its defence, and is labelled guardrails", a.name)
		}
	}
}

func TestSlug(t *testing.T) {
	if got := slug("2 A reads Secrets/ConfigMaps in lampyr-system: \"x\""); got != "2_A_reads_Secrets_ConfigMaps_in_lampyr-system_x" {
		t.Errorf("slug = %q", got)
	}
}

func TestChooseClusters(t *testing.T) {
	for v, want := range map[string]string{
		"":                               "[stock=stock lampyr=lampyr]",
		"lampyr=lampyr-x":                "[lampyr=lampyr-x]",
		"lampyr=lampyr-x, stock=stock-x": "[stock=stock-x lampyr=lampyr-x]",
	} {
		cs, err := chooseClusters(v)
		var parts []string
		for _, c := range cs {
			parts = append(parts, c.Profile+"="+c.Name)
			if c.Eventing || c.Provider != "" || c.External != nil {
				parts[len(parts)-1] += fmt.Sprintf(" %+v", c)
			}
		}
		if got := "[" + strings.Join(parts, " ") + "]"; err != nil || got != want {
			t.Errorf("chooseClusters(%q) = %s, %v; want %s", v, got, err, want)
		}
	}
	// A name no longer selects a profile: each must be stated.
	for _, v := range []string{"stock-x", "stock=stock-x", "bare=x"} {
		if cs, err := chooseClusters(v); err == nil {
			t.Errorf("chooseClusters(%q) = %v, want an error", v, cs)
		}
	}
}

func TestParseTarpitDuration(t *testing.T) {
	for v, want := range map[string]time.Duration{"": 15 * time.Minute, "20m": 20 * time.Minute, " 1m ": time.Minute} {
		if got, err := parseTarpitDuration(v); err != nil || got != want {
			t.Errorf("parseTarpitDuration(%q) = %s, %v; want %s", v, got, err, want)
		}
	}
	for _, v := range []string{"15", "30s", "soon"} {
		if _, err := parseTarpitDuration(v); err == nil || !strings.Contains(err.Error(), tarpitVar) {
			t.Errorf("parseTarpitDuration(%q): %v, want an error naming %s", v, err, tarpitVar)
		}
	}
}

// The capacity hog row's judge of what B was told.
func TestInstallationLeaks(t *testing.T) {
	capacity := resource.MustParse("8Gi")
	others := []string{"tenancy-hog-a"}
	for msg, want := range map[string]int{
		// The message before issue 31: both the capacity and what is free.
		"needs 6Gi (memoryPerFiber 2Gi × maxFibers 3) but only 2560Mi of the installation's 8Gi fiber memory is free; lower max-scale": 2,
		"Reserved 512Mi of 8Gi fiber memory.": 1,
		// A refusal speaking of the tenant's own share only.
		"needs 6Gi but namespace tenancy-hog-b may reserve 4Gi (namespace-fiber-memory-share) and already holds 0": 0,
		"its share is 18Gi":                                      0,
		"tenancy-hog-a holds 2Gi":                                1,
		"template unavailable: manifest unknown":                 0,
		"ask an administrator to raise the installation's share": 0,
	} {
		if got := installationLeaks(msg, capacity, others); len(got) != want {
			t.Errorf("installationLeaks(%q) = %q, want %d findings", msg, got, want)
		}
	}
}

func TestHomeBoundFrom(t *testing.T) {
	args := []string{"--listen=:9090", "--fiber-pids-max=1024", "--warm-fibers=2", "--home-pids-max=2048"}
	if n, where := homeBoundFrom(args, nil); n != 2048 || !strings.Contains(where, "--home-pids-max=2048") {
		t.Errorf("homeBoundFrom(args) = %d %q", n, where)
	}
	if n, _ := homeBoundFrom([]string{"--fiber-pids-max=1024"}, map[string]string{"fiber-cpu-limit": "1"}); n != 0 {
		t.Errorf("a per-fiber bound taken for the Home's: %d", n)
	}
	if n, where := homeBoundFrom(nil, map[string]string{"home-pids-limit": " 4096 ", "home-cpu-limit": "1"}); n != 4096 || where != "config-lampyr home-pids-limit" {
		t.Errorf("homeBoundFrom(config) = %d %q", n, where)
	}
}

// The Home's log as fiberd writes it (impl/fiberd/backend/process
// BoundHomeTasks): the cap at start, then the bound sized from the grant.
func TestHomeBoundFromLog(t *testing.T) {
	log := "fiberd: listening\nprocess backend: the fibers of this Home may hold 4096 tasks together (each at most 1024)\n" +
		"grant loaded\nprocess backend: the fibers of this Home may hold 1024 tasks together (each at most 1024)\n"
	if n, where := homeBoundFromLog(log); n != 1024 || !strings.Contains(where, "hold 1024 tasks") {
		t.Errorf("homeBoundFromLog = %d %q, want the last line's 1024", n, where)
	}
	if n, _ := homeBoundFromLog("process backend: the fibers of this Home may hold max tasks together (each at most 1024)\n"); n != 0 {
		t.Errorf("no Home-wide bound (max) read as %d", n)
	}
	if n, _ := homeBoundFromLog("fiberd: listening\n"); n != 0 {
		t.Errorf("a log without the line read as %d", n)
	}
}

func TestWithRouterBounds(t *testing.T) {
	orig := []string{"--http-port=80", "--max-revisions=10000", "--drain-delay=5s"}
	got := withRouterBounds(orig, 12, 3)
	want := []string{"--http-port=80", "--drain-delay=5s", "--max-revisions=12", "--max-revisions-per-namespace=3"}
	if !slices.Equal(got, want) {
		t.Errorf("withRouterBounds = %q, want %q", got, want)
	}
	if got := withRouterBounds(want, 20, 0); !slices.Equal(got, []string{"--http-port=80", "--drain-delay=5s", "--max-revisions=20"}) {
		t.Errorf("withRouterBounds without a per-namespace bound = %q", got)
	}
	if orig[1] != "--max-revisions=10000" {
		t.Error("withRouterBounds changed its argument")
	}
}

func TestReserved(t *testing.T) {
	g := &unstructured.Unstructured{Object: map[string]any{
		"spec":   map[string]any{"memoryPerFiber": "2Gi", "maxFibers": int64(2)},
		"status": map[string]any{"conditions": []any{map[string]any{"type": "Admitted", "status": "True"}}},
	}}
	if n, ok := reserved(g, 10); !ok || n != 4<<30 {
		t.Errorf("reserved = %d, %t; want 4Gi, admitted", n, ok)
	}
	_ = unstructured.SetNestedField(g.Object, int64(0), "spec", "maxFibers")
	if n, _ := reserved(g, 10); n != 20<<30 {
		t.Errorf("maxFibers 0 takes the default: %d", n)
	}
	_ = unstructured.SetNestedSlice(g.Object, []any{map[string]any{"type": "Admitted", "status": "False"}}, "status", "conditions")
	if n, ok := reserved(g, 10); ok || n != 0 {
		t.Errorf("a refused grant holds nothing: %d, %t", n, ok)
	}
}

func TestCallResultVerdicts(t *testing.T) {
	for _, tc := range []struct {
		r        callResult
		refused  bool
		verdict  string
		rendered string
	}{
		{callResult{Status: 200, Body: "Hello World!\n"}, false, "200", `200 "Hello World!"`},
		{callResult{Status: 400, Body: "Client sent an HTTP request to an HTTPS server."}, false, "400", ""},
		{callResult{Error: "dns"}, true, "no answer", "no answer (dns)"},
		{callResult{Error: "connect"}, true, "no answer", ""},
		// A timeout may be a connection made and never answered (DNS over
		// TCP): not the refusal Lampyr promises.
		{callResult{Error: "timeout"}, false, "no answer", ""},
		{callResult{Error: "protocol"}, false, "no answer", ""},
	} {
		if got := tc.r.refusedByName(); got != tc.refused {
			t.Errorf("%+v: refusedByName %t", tc.r, got)
		}
		if got := tc.r.verdict(); got != tc.verdict {
			t.Errorf("%+v: verdict %q", tc.r, got)
		}
		if tc.rendered != "" && tc.r.String() != tc.rendered {
			t.Errorf("%+v: %q", tc.r, tc.r.String())
		}
	}
}

func TestTarpitTable(t *testing.T) {
	got := tarpitTable([]*tarpitMinute{{ok: 30, errs: map[string]int{}}, {ok: 12, failed: 18, errs: map[string]int{`503 "no valid grant"`: 18}}})
	if got != `30/0 12/18 [503 "no valid grant" ×18]` {
		t.Errorf("tarpitTable = %q", got)
	}
}

// Attack 11 puts back only its own mapping: the guard-rail rows' mapping,
// made by the setup, stays until the finish step puts everything back.
func TestRestoreImageSnapshotsByImage(t *testing.T) {
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: contract.ConfigMapName, Namespace: contract.SystemNamespace},
		Data: map[string]string{imageSnapshotsKey: "reg/admin@sha256:1: reg/snap@sha256:9\n"}}
	c := &e2eutil.Clients{Kube: fake.NewSimpleClientset(cm)}
	read := func() string {
		got, err := c.Kube.CoreV1().ConfigMaps(contract.SystemNamespace).Get(ctx, contract.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got.Data[imageSnapshotsKey]
	}
	rows, attack11 := "reg/"+rowRepo+"/handler@sha256:2", "reg/tenancy-b/handler@sha256:2"
	for _, img := range []string{rows, attack11} {
		if err := mapImageSnapshot(ctx, c, img, "reg/snap@sha256:3"); err != nil {
			t.Fatal(err)
		}
	}
	if err := restoreImageSnapshots(ctx, c, attack11); err != nil {
		t.Fatal(err)
	}
	if got := read(); strings.Contains(got, attack11) || !strings.Contains(got, rows) || !strings.Contains(got, "reg/admin@sha256:1") {
		t.Errorf("after attack 11's restore: %q; want the rows' and the administrator's entries, not attack 11's", got)
	}
	if err := restoreImageSnapshots(ctx, c); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "reg/admin@sha256:1: reg/snap@sha256:9\n" {
		t.Errorf("after the finish step's restore: %q; want only the administrator's entry", got)
	}
}

// TestWithoutDefencePatchesApply: the patches hack/without-defences.sh
// removes the guard-rail defences with still apply to this tree, so the
// proof that each row fails without its defence can be run again (a change
// to the code they touch must carry its patch along).
func TestWithoutDefencePatchesApply(t *testing.T) {
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("git is not installed: cannot check that the without-defence patches apply")
	}
	root, err := exec.Command(git, "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout (%v): cannot check that the without-defence patches apply", err)
	}
	patches, err := filepath.Glob("testdata/without-defences/*.patch")
	if err != nil || len(patches) == 0 {
		t.Fatalf("no patches under testdata/without-defences (%v)", err)
	}
	for _, p := range patches {
		abs, _ := filepath.Abs(p)
		cmd := exec.Command(git, "apply", "--check", abs)
		cmd.Dir = strings.TrimSpace(string(root))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s no longer applies (update it with the code it removes a defence from): %v\n%s", p, err, out)
		}
	}
}
