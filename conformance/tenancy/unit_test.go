package tenancy

// Plain tests of the suite's own logic: they run with `go test` whether or
// not LAMPYR_E2E is set, so a broken verdict is caught without a cluster.

import (
	"fmt"
	"strings"
	"testing"
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
	if !strings.Contains(md, "4 rows; on Lampyr 2 not refused (or control failed), 1 not run.") {
		t.Errorf("summary line wrong:\n%s", md)
	}
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(l, "| ") && strings.Count(strings.ReplaceAll(l, `\|`, ""), "|") != 5 {
			t.Errorf("row with the wrong number of cells: %s", l)
		}
	}
}

func TestAttacksAreWellFormed(t *testing.T) {
	seen := map[string]bool{}
	for _, a := range append(append([]attack{}, attacks...), fiberAttacks...) {
		if a.name == "" || a.expected == "" || a.run == nil || a.appliesTo&onLampyr == 0 {
			t.Errorf("attack %q: every attack has a name, an expectation, a run func and applies to Lampyr", a.name)
		}
		if seen[a.name] {
			t.Errorf("attack %q declared twice (Its are named after attacks)", a.name)
		}
		seen[a.name] = true
	}
}

func TestSlug(t *testing.T) {
	if got := slug("2 A reads Secrets/ConfigMaps in lampyr-system: \"x\""); got != "2_A_reads_Secrets_ConfigMaps_in_lampyr-system_x" {
		t.Errorf("slug = %q", got)
	}
}

func TestChooseClusters(t *testing.T) {
	for v, want := range map[string]string{
		"":                               "[{stock stock false} {lampyr lampyr false}]",
		"lampyr=lampyr-x":                "[{lampyr-x lampyr false}]",
		"lampyr=lampyr-x, stock=stock-x": "[{stock-x stock false} {lampyr-x lampyr false}]",
	} {
		cs, err := chooseClusters(v)
		if got := fmt.Sprint(cs); err != nil || got != want {
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
