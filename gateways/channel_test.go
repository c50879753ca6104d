package gateways

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

// recorder keeps every byte written through it.
type recorder struct {
	net.Conn
	mu  sync.Mutex
	out bytes.Buffer
}

func (r *recorder) Write(b []byte) (int, error) {
	r.mu.Lock()
	r.out.Write(b)
	r.mu.Unlock()
	return r.Conn.Write(b)
}

// pair runs a handshake over a pipe; dialer is "gw-a", listener "gw-b".
func pair(t *testing.T, dkey, lkey []byte, dhash, lhash [32]byte) (d, l *conn, derr, lerr error, rec *recorder) {
	t.Helper()
	a, b := tcpPair(t)
	rec = &recorder{Conn: a}
	for _, c := range []net.Conn{a, b} {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		l, _, lerr = handshake(b, handshakeParams{key: lkey, self: "gw-b", setHash: lhash, incarnation: 2,
			accept: func(n string) bool { return n == "gw-a" }})
		if lerr != nil {
			b.Close()
		}
	})
	d, _, derr = handshake(rec, handshakeParams{key: dkey, self: "gw-a", setHash: dhash, incarnation: 1, dialer: true, expect: "gw-b"})
	if derr != nil {
		a.Close()
	}
	wg.Wait()
	return
}

func TestChannelRoundTrip(t *testing.T) {
	h := [32]byte{1}
	d, l, derr, lerr, rec := pair(t, testKey, testKey, h, h)
	if derr != nil || lerr != nil {
		t.Fatalf("handshake: %v / %v", derr, lerr)
	}
	if d.incarnation != 2 || l.incarnation != 1 {
		t.Errorf("incarnations %d %d, want 2 1", d.incarnation, l.incarnation)
	}
	secret := []byte("the state of gw-a: 192.0.2.1 held")
	go func() { _ = d.send(secret) }()
	got, err := l.recv()
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("recv = %q, %v", got, err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if bytes.Contains(rec.out.Bytes(), []byte("192.0.2.1")) {
		t.Errorf("the plaintext is visible on the wire")
	}
}

func TestChannelWrongKeyRefusedBothWays(t *testing.T) {
	h := [32]byte{1}
	other := bytes.Repeat([]byte("x"), 32)
	_, _, derr, lerr, _ := pair(t, testKey, other, h, h)
	if !errors.Is(lerr, ErrBadKey) {
		t.Errorf("listener: %v, want ErrBadKey", lerr)
	}
	if !errors.Is(derr, ErrBadKey) {
		t.Errorf("dialer: %v, want ErrBadKey", derr)
	}
	if refusalReason(lerr) != "key" {
		t.Errorf("reason %q", refusalReason(lerr))
	}
}

func TestChannelSetDiffersRefused(t *testing.T) {
	_, _, derr, lerr, _ := pair(t, testKey, testKey, [32]byte{1}, [32]byte{2})
	if !errors.Is(lerr, ErrSetDiffers) || !errors.Is(derr, ErrSetDiffers) {
		t.Errorf("got %v / %v, want ErrSetDiffers on both ends", derr, lerr)
	}
}

func TestChannelUnknownPeerRefused(t *testing.T) {
	a, b := tcpPair(t)
	go func() {
		_, _, _ = handshake(a, handshakeParams{key: testKey, self: "gw-z", dialer: true, expect: "gw-b"})
		a.Close()
	}()
	_, claimed, err := handshake(b, handshakeParams{key: testKey, self: "gw-b", accept: func(n string) bool { return n == "gw-a" }})
	if !errors.Is(err, ErrUnknownPeer) || claimed != "gw-z" {
		t.Errorf("got %v from %q, want ErrUnknownPeer from gw-z", err, claimed)
	}
}

// A frame written again (a replay) or altered does not open.
func TestChannelReplayAndTamperRefused(t *testing.T) {
	h := [32]byte{1}
	for _, tc := range []struct {
		name   string
		mangle func(frame []byte) []byte
	}{
		{"replay", func(f []byte) []byte { return append(append([]byte{}, f...), f...) }},
		{"tamper", func(f []byte) []byte { g := append([]byte{}, f...); g[len(g)-1] ^= 1; return g }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, l, derr, lerr, rec := pair(t, testKey, testKey, h, h)
			if derr != nil || lerr != nil {
				t.Fatal(derr, lerr)
			}
			rec.mu.Lock()
			rec.out.Reset()
			rec.mu.Unlock()
			done := make(chan error, 1)
			go func() { done <- d.send([]byte("hold 192.0.2.1")) }()
			if _, err := l.recv(); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			rec.mu.Lock()
			frame := append([]byte{}, rec.out.Bytes()...)
			rec.mu.Unlock()
			bad := tc.mangle(frame)
			if tc.name == "replay" {
				bad = frame
			}
			go func() { _, _ = d.c().Write(bad) }()
			if _, err := l.recv(); !errors.Is(err, errOpen) {
				t.Fatalf("%s frame: %v, want errOpen", tc.name, err)
			}
		})
	}
}

// c is the raw connection under the sealing, to write forged bytes.
func (c *conn) c() net.Conn {
	if r, ok := c.nc.(*recorder); ok {
		return r.Conn
	}
	return c.nc
}

// tcpPair is a connected pair of TCP sockets on loopback (a net.Pipe
// would block both ends writing their hellos at once).
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}
