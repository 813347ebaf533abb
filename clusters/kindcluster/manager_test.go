package kindcluster

import (
	"strings"
	"testing"
)

func TestRestartedNodes(t *testing.T) {
	created := map[string]string{"c-control-plane": "2026-11-29T10:00:00.1Z"}
	for _, tc := range []struct {
		name string
		now  map[string]string
		lost bool
		why  string
	}{
		{"same start", map[string]string{"c-control-plane": "2026-11-29T10:00:00.1Z"}, false, ""},
		{"restarted", map[string]string{"c-control-plane": "2026-11-29T12:00:00.1Z"}, true, "was restarted (at 2026-11-29T12:00:00.1Z"},
		{"stopped", map[string]string{"c-control-plane": "not running"}, true, "is not running"},
		{"gone", map[string]string{}, true, "is gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lost, why := restartedNodes(created, tc.now)
			if lost != tc.lost || !strings.Contains(why, tc.why) {
				t.Errorf("restartedNodes = %v %q, want %v and a reason containing %q", lost, why, tc.lost, tc.why)
			}
		})
	}
}
