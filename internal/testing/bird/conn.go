package bird

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"
)

// Conn is one connection to BIRD's control socket, the one birdc opens,
// kept open for many commands: a command costs BIRD's answer and no
// process start, so a route can be looked for every millisecond without
// the looking being what is measured.
type Conn struct {
	c net.Conn
	r *bufio.Reader
}

// Dial connects to the router's control socket and reads its greeting.
func (b *Router) Dial() (*Conn, error) {
	c, err := net.Dial("unix", b.sock)
	if err != nil {
		return nil, err
	}
	cn := &Conn{c: c, r: bufio.NewReader(c)}
	if _, err := cn.reply(); err != nil {
		c.Close()
		return nil, fmt.Errorf("bird greeting: %w", err)
	}
	return cn, nil
}

// Close closes the connection.
func (cn *Conn) Close() error { return cn.c.Close() }

// Command sends one CLI command and returns its answer without the reply
// codes, one line of text per line, as birdc prints it. An error answer
// (codes 8xxx and 9xxx, "Network not found" among them) is an error.
func (cn *Conn) Command(cmd string) (string, error) {
	if err := cn.c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return "", err
	}
	if _, err := cn.c.Write([]byte(cmd + "\n")); err != nil {
		return "", err
	}
	out, err := cn.reply()
	if err != nil {
		return "", fmt.Errorf("bird %s: %w", cmd, err)
	}
	return out, nil
}

// reply reads one answer: lines "DDDD-text" and " text" continue it, the
// line "DDDD text" ends it.
func (cn *Conn) reply() (string, error) {
	var b strings.Builder
	for {
		line, err := cn.r.ReadString('\n')
		if err != nil {
			return "", err
		}
		line = strings.TrimSuffix(line, "\n")
		if strings.HasPrefix(line, " ") {
			b.WriteString(line[1:] + "\n")
			continue
		}
		if len(line) < 5 {
			return "", fmt.Errorf("malformed line %q", line)
		}
		code, sep, text := line[:4], line[4], line[5:]
		if code[0] == '8' || code[0] == '9' {
			// An error: read to the end of the answer, then report it.
			for sep == '-' {
				next, err := cn.r.ReadString('\n')
				if err != nil {
					return "", err
				}
				sep = next[4]
			}
			return "", fmt.Errorf("%s", text)
		}
		if code != "0000" {
			b.WriteString(text + "\n")
		}
		if sep == ' ' {
			return b.String(), nil
		}
	}
}

// HasRoute tells whether BIRD's table holds prefix.
func (cn *Conn) HasRoute(prefix netip.Prefix) (bool, error) {
	out, err := cn.Command("show route " + prefix.String())
	if err != nil {
		if strings.Contains(err.Error(), "Network not found") {
			return false, nil
		}
		return false, err
	}
	return listsRoute(out, prefix), nil
}

// RouteCount is how many routes protocol name gave BIRD's tables.
func (cn *Conn) RouteCount(name string) (int, error) {
	out, err := cn.Command("show route protocol " + name + " count")
	if err != nil {
		return 0, err
	}
	return parseRouteCount(out)
}

// GracefulRestartActive tells whether BIRD is in the middle of its
// neighbour's graceful restart on protocol name: it keeps the routes of
// the session that went down as stale, and drops those the new session
// has not announced again when the neighbour's End-of-RIB arrives, which
// ends it.
func (cn *Conn) GracefulRestartActive(name string) (bool, error) {
	out, err := cn.Command("show protocols all " + name)
	if err != nil {
		return false, err
	}
	return strings.Contains(out, "Neighbor graceful restart active"), nil
}
