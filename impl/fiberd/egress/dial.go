package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// Dialer opens the outside half of a fiber's TCP connection to dst, an
// address the fiber's Guard allowed. fiberd's two: DirectDial (from the
// Home) and the tenant namespace's egress proxy (package proxy).
type Dialer func(ctx context.Context, dst netip.AddrPort) (net.Conn, error)

// directDialTimeout bounds a direct connection's set-up.
const directDialTimeout = 10 * time.Second

// DirectDial connects from the Home's own network namespace (fiber-egress
// "direct"; the destination sees a Home in lampyr-homes). What it reached
// must be dst itself.
func DirectDial(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	d := net.Dialer{Timeout: directDialTimeout}
	c, err := d.DialContext(ctx, "tcp", dst.String())
	if err != nil {
		return nil, err
	}
	if ra, ok := c.RemoteAddr().(*net.TCPAddr); !ok || ra.AddrPort() != dst {
		c.Close()
		return nil, fmt.Errorf("dialled %v, not %v", c.RemoteAddr(), dst)
	}
	return c, nil
}
