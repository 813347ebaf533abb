// Package runcwrap removes capabilities the host cannot grant from OCI specs
// before runc sees them.
//
// On hosts whose capability bounding set lacks a capability (seen: sandboxes
// without CAP_SYS_RESOURCE), `docker run --privileged` asks runc for every
// capability and fails with "unable to apply caps: operation not permitted".
// Kind runs every node command through `docker exec --privileged`, so both the
// bundle's config.json (runc create/run) and the process file (runc exec
// --process) must be filtered.
package runcwrap

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// capabilitySets are the keys of an OCI LinuxCapabilities object.
var capabilitySets = []string{"bounding", "effective", "inheritable", "permitted", "ambient"}

// FilterCapabilities removes drop from every capability list of caps (an OCI
// LinuxCapabilities object) and reports whether anything changed.
func FilterCapabilities(caps map[string]any, drop map[string]bool) bool {
	changed := false
	for _, set := range capabilitySets {
		list, ok := caps[set].([]any)
		if !ok {
			continue
		}
		kept := make([]any, 0, len(list))
		for _, c := range list {
			if name, ok := c.(string); ok && drop[name] {
				changed = true
				continue
			}
			kept = append(kept, c)
		}
		caps[set] = kept
	}
	return changed
}

// FilterSpec filters a runtime spec (config.json): capabilities live under
// process.capabilities.
func FilterSpec(spec []byte, drop map[string]bool) ([]byte, bool, error) {
	var doc map[string]any
	if err := json.Unmarshal(spec, &doc); err != nil {
		return nil, false, fmt.Errorf("parse OCI runtime spec: %w", err)
	}
	process, _ := doc["process"].(map[string]any)
	caps, _ := process["capabilities"].(map[string]any)
	if caps == nil || !FilterCapabilities(caps, drop) {
		return spec, false, nil
	}
	out, err := json.Marshal(doc)
	return out, true, err
}

// FilterProcess filters a process file (runc exec --process): capabilities
// are at its top level.
func FilterProcess(process []byte, drop map[string]bool) ([]byte, bool, error) {
	var doc map[string]any
	if err := json.Unmarshal(process, &doc); err != nil {
		return nil, false, fmt.Errorf("parse OCI process file: %w", err)
	}
	caps, _ := doc["capabilities"].(map[string]any)
	if caps == nil || !FilterCapabilities(caps, drop) {
		return process, false, nil
	}
	out, err := json.Marshal(doc)
	return out, true, err
}

// FilesToFilter finds, in a runc command line, the spec and process files
// that will be read: "<bundle>/config.json" for create/run and the --process
// file for exec. Global flags may precede the subcommand.
func FilesToFilter(args []string) (specs, processes []string) {
	bundle := ""
	sub := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		value := func() string {
			if i+1 < len(args) {
				i++
				return args[i]
			}
			return ""
		}
		switch {
		case a == "--bundle" || a == "-b":
			bundle = value()
		case len(a) > 9 && a[:9] == "--bundle=":
			bundle = a[9:]
		case a == "--process" || a == "-p":
			processes = append(processes, value())
		case len(a) > 10 && a[:10] == "--process=":
			processes = append(processes, a[10:])
		case sub == "" && (a == "create" || a == "run" || a == "exec"):
			sub = a
		}
	}
	if (sub == "create" || sub == "run") && bundle == "" {
		bundle = "." // runc's default bundle is the working directory
	}
	if sub == "create" || sub == "run" {
		specs = append(specs, filepath.Join(bundle, "config.json"))
	}
	if sub != "exec" {
		processes = nil
	}
	return specs, processes
}

// RewriteFile applies filter to path in place, keeping its mode.
func RewriteFile(path string, filter func([]byte, map[string]bool) ([]byte, bool, error), drop map[string]bool) error {
	in, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, changed, err := filter(in, drop)
	if err != nil || !changed {
		return err
	}
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, info.Mode().Perm())
}
