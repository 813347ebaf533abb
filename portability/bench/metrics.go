package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"lampyr.dev/serving/impl/contract"
)

// The bench's metrics, read from the host: each Kind node's cgroup (CPU,
// memory, as docker stats reports them) and its containers' CRI stats.

// MemTotal is the host's memory (MemTotal of /proc/meminfo).
func MemTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.Join(strings.Fields(line)[1:], " ")
}

// CPURates samples the clusters' CPU counters at the start and end of the
// same window and returns each counter's mean rate over it, in millicores,
// per cluster; ns is the workload's namespace.
func CPURates(clusters []string, ns string, window time.Duration) ([]map[string]float64, error) {
	before := make([]map[string]float64, len(clusters))
	rates := make([]map[string]float64, len(clusters))
	for i, cl := range clusters {
		c, err := cpuCounters(cl, ns)
		if err != nil {
			return nil, err
		}
		before[i] = c
	}
	time.Sleep(window)
	for i, cl := range clusters {
		c, err := cpuCounters(cl, ns)
		if err != nil {
			return nil, err
		}
		rates[i] = map[string]float64{}
		for k, v := range c {
			rates[i][k] = (v - before[i][k]) / float64(window.Nanoseconds()) * 1000
		}
	}
	return rates, nil
}

// Footprint reads, inside a cluster's node, the memory of the whole node
// (its cgroup, as docker stats reports it), of the serving control and data
// plane (knative-serving, lampyr-system, traefik), and of the workload (the
// namespace ns; on Lampyr its Homes, in lampyr-homes, where only this
// bench's Revisions run), from crictl stats (working set), in MiB.
func Footprint(cluster, ns string) (map[string]float64, error) {
	node := cluster + "-control-plane"
	out, err := exec.Command("docker", "stats", "--no-stream", "--format", "{{.MemUsage}}", node).Output()
	if err != nil {
		return nil, fmt.Errorf("docker stats %s: %w", node, err)
	}
	used, _, _ := strings.Cut(strings.TrimSpace(string(out)), "/")
	fp := map[string]float64{"node memory": parseMiB(strings.TrimSpace(used))}
	stats, err := criStats(node)
	if err != nil {
		return nil, err
	}
	for _, c := range stats {
		switch c.namespace {
		case "knative-serving", "lampyr-system", "traefik":
			fp["serving planes memory"] += c.workingSet / (1 << 20)
		case ns, contract.HomesNamespace:
			fp["workload memory"] += c.workingSet / (1 << 20)
		}
	}
	return fp, nil
}

// NodeWorkingSetMiB is a cluster's node container's working set in MiB:
// its cgroup's memory usage minus the inactive file cache, as kubelet and
// docker stats count it (cgroup v1 memory.usage_in_bytes and
// total_inactive_file, or v2 memory.current and inactive_file; Docker's
// cgroupfs or systemd layout).
func NodeWorkingSetMiB(cluster string) (float64, error) {
	node := cluster + "-control-plane"
	out, err := exec.Command("docker", "inspect", "-f", "{{.Id}}", node).Output()
	if err != nil {
		return 0, fmt.Errorf("docker inspect %s: %w", node, err)
	}
	id := strings.TrimSpace(string(out))
	for _, d := range []struct{ dir, usage, inactive string }{
		{"/sys/fs/cgroup/memory/docker/" + id, "memory.usage_in_bytes", "total_inactive_file"},
		{"/sys/fs/cgroup/memory/system.slice/docker-" + id + ".scope", "memory.usage_in_bytes", "total_inactive_file"},
		{"/sys/fs/cgroup/system.slice/docker-" + id + ".scope", "memory.current", "inactive_file"},
		{"/sys/fs/cgroup/docker/" + id, "memory.current", "inactive_file"},
	} {
		u, err := os.ReadFile(d.dir + "/" + d.usage)
		if err != nil {
			continue
		}
		usage, err := strconv.ParseFloat(strings.TrimSpace(string(u)), 64)
		if err != nil {
			return 0, fmt.Errorf("%s/%s: %w", d.dir, d.usage, err)
		}
		st, err := os.ReadFile(d.dir + "/memory.stat")
		if err != nil {
			return 0, err
		}
		inactive := 0.0
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, d.inactive+" "); ok {
				inactive, _ = strconv.ParseFloat(v, 64)
			}
		}
		return (usage - min(inactive, usage)) / (1 << 20), nil
	}
	return 0, fmt.Errorf("no cgroup memory counter for container %s (looked under /sys/fs/cgroup for Docker's cgroupfs and systemd layouts, v1 and v2)", node)
}

// cpuCounters reads a cluster's cumulative CPU time in nanoseconds: the
// node container's cgroup (cgroup v1 cpuacct or v2 cpu.stat, Docker's
// cgroupfs or systemd layout) and the serving planes' containers (CRI
// stats).
func cpuCounters(cluster, ns string) (map[string]float64, error) {
	node := cluster + "-control-plane"
	out, err := exec.Command("docker", "inspect", "-f", "{{.Id}}", node).Output()
	if err != nil {
		return nil, fmt.Errorf("docker inspect %s: %w", node, err)
	}
	id := strings.TrimSpace(string(out))
	c := map[string]float64{}
	found := false
	for _, f := range []string{
		"/sys/fs/cgroup/cpuacct/docker/" + id + "/cpuacct.usage",
		"/sys/fs/cgroup/cpuacct/system.slice/docker-" + id + ".scope/cpuacct.usage",
	} {
		if b, err := os.ReadFile(f); err == nil {
			c["node CPU"], _ = strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
			found = true
			break
		}
	}
	for _, f := range []string{
		"/sys/fs/cgroup/system.slice/docker-" + id + ".scope/cpu.stat",
		"/sys/fs/cgroup/docker/" + id + "/cpu.stat",
	} {
		if found {
			break
		}
		if b, err := os.ReadFile(f); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
					us, _ := strconv.ParseFloat(v, 64)
					c["node CPU"] = us * 1000
					found = true
				}
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("no cgroup CPU counter for container %s (looked under /sys/fs/cgroup for Docker's cgroupfs and systemd layouts)", node)
	}
	stats, err := criStats(node)
	if err != nil {
		return nil, err
	}
	for _, st := range stats {
		switch st.namespace {
		case "knative-serving", "lampyr-system", "traefik":
			c["serving planes CPU"] += st.cpuNanos
		case ns, contract.HomesNamespace:
			c["workload CPU"] += st.cpuNanos
		}
	}
	return c, nil
}

// criStat is one container's CRI stats: its pod's namespace, working set
// (bytes) and cumulative CPU time (ns).
type criStat struct {
	namespace            string
	workingSet, cpuNanos float64
}

// criStats reads every container's stats in a node with crictl.
func criStats(node string) ([]criStat, error) {
	raw, err := exec.Command("docker", "exec", node, "crictl", "stats", "-o", "json").Output()
	if err != nil {
		return nil, fmt.Errorf("crictl stats in %s: %w", node, err)
	}
	type value struct {
		Value string `json:"value"`
	}
	var st struct {
		Stats []struct {
			Attributes struct {
				Labels map[string]string `json:"labels"`
			} `json:"attributes"`
			Memory struct {
				WorkingSetBytes value `json:"workingSetBytes"`
			} `json:"memory"`
			CPU struct {
				UsageCoreNanoSeconds value `json:"usageCoreNanoSeconds"`
			} `json:"cpu"`
		} `json:"stats"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, fmt.Errorf("crictl stats in %s: %w", node, err)
	}
	out := make([]criStat, 0, len(st.Stats))
	for _, s := range st.Stats {
		ws, _ := strconv.ParseFloat(s.Memory.WorkingSetBytes.Value, 64)
		cpu, _ := strconv.ParseFloat(s.CPU.UsageCoreNanoSeconds.Value, 64)
		out = append(out, criStat{namespace: s.Attributes.Labels["io.kubernetes.pod.namespace"], workingSet: ws, cpuNanos: cpu})
	}
	return out, nil
}

func parseMiB(s string) float64 {
	units := map[string]float64{"KiB": 1.0 / 1024, "MiB": 1, "GiB": 1024, "B": 1.0 / (1 << 20)}
	for _, u := range []string{"KiB", "MiB", "GiB", "B"} {
		if strings.HasSuffix(s, u) {
			v, _ := strconv.ParseFloat(strings.TrimSuffix(s, u), 64)
			return v * units[u]
		}
	}
	return 0
}
