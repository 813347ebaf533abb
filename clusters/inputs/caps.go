package inputs

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// capSysResource is CAP_SYS_RESOURCE's bit number.
const capSysResource = 24

// HostHasCapability reports whether this process's capability bounding set
// holds capability bit capBit (read from /proc/self/status).
func HostHasCapability(capBit uint) bool {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return true
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "CapBnd:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err != nil || mask&(1<<capBit) != 0
		}
	}
	return true
}
