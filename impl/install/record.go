package install

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// RecordedNodePort is the gateway NodePort the cluster framework recorded
// for a Kind cluster it made: the first port of <stateDir>/<name>.json
// (clusters/kindcluster.Info, whose Gateway() is that port). `ly cluster
// install` uses it on a cluster made by `just cluster-up`, whose gateway
// is not on DefaultNodePort. False when there is no readable record or it
// names no port.
func RecordedNodePort(stateDir, name string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(stateDir, name+".json"))
	if err != nil {
		return 0, false
	}
	var rec struct {
		Ports []struct {
			NodePort int `json:"nodePort"`
		} `json:"ports"`
	}
	if err := json.Unmarshal(b, &rec); err != nil || len(rec.Ports) == 0 {
		return 0, false
	}
	return rec.Ports[0].NodePort, true
}
