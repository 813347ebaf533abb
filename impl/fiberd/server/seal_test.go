package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/fiberd/seal"
)

// TestFiberdRefusesBadTemplates points a running fiberd's grant at templates
// it must refuse and checks it serves nothing and says why.
func TestFiberdRefusesBadTemplates(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{})
	ctx := context.Background()
	digest := inst.SnapshotRef[strings.LastIndex(inst.SnapshotRef, "@")+1:]
	good := seal.Template{
		Revision: "hello-00001", SnapshotDigest: digest,
		Execution: seal.ExecutionPolicy{Mode: "fresh"},
		Helper:    seal.HelperFacts{Port: 8080},
	}
	other, _ := seal.GenerateFleetKey()
	otherDigest := good
	otherDigest.SnapshotDigest = "sha256:" + strings.Repeat("0", 64)

	sealTo := func(k *seal.PublicKey, tpl seal.Template) []byte {
		b, err := seal.Seal(k, tpl)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	altered := sealTo(inst.FleetKey.Public(), good)
	altered[len(altered)/2] ^= 0x01

	for _, tc := range []struct {
		name   string
		sealed []byte
		reason string
		want   string
	}{
		{"sealed to another fleet key", sealTo(other.Public(), good), "TemplateUnsealable", "another fleet key"},
		{"altered in one byte", altered, "TemplateUnsealable", "altered or corrupted"},
		{"names a different snapshot digest", sealTo(inst.FleetKey.Public(), otherDigest), "TemplateMismatch", "template names snapshot sha256:0000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref, err := artifact.PushTemplate(ctx, tc.sealed, inst.Registry+"/lampyr/templates", "bad-"+strings.ReplaceAll(tc.name, " ", "-"), "x")
			if err != nil {
				t.Fatal(err)
			}
			c := inst.Claims
			c.Template = ref.String()
			c.GrantID = "grant-" + tc.name
			c.IssuedAt = time.Now()
			inst.WriteGrant(t, c)
			_, err = inst.Client.Acquire(ctx)
			if !client.IsUnavailable(err) || !strings.Contains(err.Error(), tc.reason) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("acquire under a grant naming this template: %v; want 503 with %s and %q", err, tc.reason, tc.want)
			}
			if err := inst.Client.Ready(ctx); err == nil {
				t.Fatal("fiberd reports ready with a refused template")
			}
			if g, err := inst.Client.Grant(ctx); err != nil || g.TemplateLoaded || !strings.Contains(g.LoadError, tc.reason) {
				t.Fatalf("GET /v1/grant: %+v %v; want loadError with %s", g, err, tc.reason)
			}
		})
	}
}
