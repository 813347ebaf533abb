package main

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"lampyr.dev/serving/impl/fiberd/egress/proxy"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

func TestEgressDialFlags(t *testing.T) {
	base := sandboxFlags{egress: "cluster", egressAllow: "10.96.0.0/12", grantFile: "/nonexistent"}
	for _, tc := range []struct {
		dial, api string
		err       string
		proxied   bool
	}{
		{dial: "direct"},
		{dial: ""},
		{dial: "proxy", err: "--egress-api"},
		{dial: "proxy", api: "http://lampyr-grant-controller.lampyr-system.svc:8092", proxied: true},
		{dial: "socks", err: "--egress-dial"},
	} {
		sb := base
		sb.egressDial, sb.egressAPI = tc.dial, tc.api
		eg, err := sb.egressConfig()
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want an error naming %s", tc.dial, err, tc.err)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.dial, err)
		case (eg.Dial != nil) != tc.proxied:
			t.Errorf("%q: proxied %v, want %v", tc.dial, eg.Dial != nil, tc.proxied)
		}
	}
}

// `fiberd egress-proxy` from its environment, as the egress Pod runs it.
func TestEgressProxySubcommand(t *testing.T) {
	pub, _, _ := signedgrant.GenerateKey()
	pem, _ := signedgrant.MarshalPublicKey(pub)
	if err := egressProxyMain([]string{"--namespace=tenant", "--grant-key=nonsense"}); err == nil || !strings.Contains(err.Error(), "--grant-key") {
		t.Errorf("bad key: %v", err)
	}
	t.Setenv(EnvGrantKey, string(pem))
	t.Setenv(EnvPodNamespace, "")
	if err := egressProxyMain(nil); err == nil || !strings.Contains(err.Error(), EnvPodNamespace) {
		t.Errorf("no namespace: %v", err)
	}
	t.Setenv(EnvPodNamespace, "tenant")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	go egressProxyMain([]string{"--listen=" + addr})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if resp, err := http.Get("http://" + addr + proxy.HealthPath); err == nil && resp.StatusCode == 200 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the egress proxy never answered its health check")
}
