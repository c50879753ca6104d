// Package httpservertest checks, over real TCP connections, that an HTTP
// server enforces the limits of package httpserver.
package httpservertest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Patience is how long a check waits for the server to act. It only bounds
// a test that would otherwise hang; the limits under test are far shorter.
const Patience = 20 * time.Second

// IdleIsClosed sends one request on a keep-alive connection to addr, reads
// the answer, and then waits for the server to close the idle connection.
func IdleIsClosed(addr, path string) error {
	c, err := net.DialTimeout("tcp", addr, Patience)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(Patience))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path); err != nil {
		return err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Close {
		return errors.New("the server closed after the first request: no keep-alive to test")
	}
	return waitClosed(br)
}

// SlowHeaderIsCut sends a request header one line at a time, every
// interval, never finishing it, and waits for the server to close the
// connection.
func SlowHeaderIsCut(addr string, interval time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, Patience)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(Patience))
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n"); err != nil {
			return
		}
		t := time.NewTicker(interval)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			if _, err := fmt.Fprintf(c, "X-Slow-%d: 1\r\n", i); err != nil {
				return
			}
		}
	}()
	return waitClosed(bufio.NewReader(c))
}

// waitClosed reads until the server closes the connection; a 408 answer
// before the close is accepted, as Go's server may send one.
func waitClosed(br *bufio.Reader) error {
	for {
		_, err := br.ReadByte()
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("the server kept the connection open for %s", Patience)
		}
		if errors.Is(err, io.EOF) || strings.Contains(err.Error(), "connection reset") {
			return nil
		}
		return err
	}
}

// LargeHeaderIsRefused sends a request whose header exceeds size bytes and
// checks that the answer is 431.
func LargeHeaderIsRefused(addr string, size int) error {
	c, err := net.DialTimeout("tcp", addr, Patience)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(Patience))
	go func() {
		_, _ = fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", size+4096))
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		return fmt.Errorf("a header over %d bytes got %s, want 431", size, resp.Status)
	}
	return nil
}
