package gateways

import (
	"bufio"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/crypto/chacha20poly1305"
)

// The channel between two gateways. Both ends send a hello in the clear
// (a magic, a random nonce and the sender's name); the session keys are
// HKDF-SHA256 of the shared key over both nonces and both names, one key
// per direction; every frame after that is sealed with ChaCha20-Poly1305
// under a counter nonce, its length header as additional data. The first
// sealed frame each way carries the hash of the configured gateway set and
// the sender's incarnation (a random number per process start). So a peer
// without the key can neither read a frame nor write one the other end
// opens; a recorded frame replayed, in this session (wrong counter) or in
// another (other nonces, other keys), does not open.

const (
	magic     = "NFTGW\x01"
	nonceLen  = 32
	maxFrame  = 16 << 20
	frameHead = 4
)

// Why a hello was refused; the reasons of refused_hellos.
var (
	ErrBadKey      = errors.New("authentication failed: the peer does not hold this set's key")
	ErrSetDiffers  = errors.New("the peer's gateway set differs from this one's (names or heartbeat timing)")
	ErrUnknownPeer = errors.New("not a configured peer")
	ErrProtocol    = errors.New("not the gateway channel protocol")
)

// refusalReason is the metric label of a handshake error.
func refusalReason(err error) string {
	switch {
	case errors.Is(err, ErrBadKey):
		return "key"
	case errors.Is(err, ErrSetDiffers):
		return "set"
	case errors.Is(err, ErrUnknownPeer):
		return "unknown_peer"
	default:
		return "protocol"
	}
}

// conn is one authenticated channel.
type conn struct {
	nc          net.Conn
	r           *bufio.Reader
	peer        string
	incarnation uint64 // the peer's

	seal, open       cipher.AEAD
	wmu              sync.Mutex
	sendCtr, recvCtr uint64
	wbuf, rbuf       []byte
}

// hello is what each end says.
type hello struct {
	nonce [nonceLen]byte
	name  string
}

func writeHello(w io.Writer, h hello) error {
	b := make([]byte, 0, len(magic)+nonceLen+1+len(h.name))
	b = append(b, magic...)
	b = append(b, h.nonce[:]...)
	b = append(b, byte(len(h.name)))
	b = append(b, h.name...)
	_, err := w.Write(b)
	return err
}

func readHello(r io.Reader) (hello, error) {
	var h hello
	b := make([]byte, len(magic)+nonceLen+1)
	if _, err := io.ReadFull(r, b); err != nil {
		return h, fmt.Errorf("%w: hello: %v", ErrProtocol, err)
	}
	if string(b[:len(magic)]) != magic {
		return h, fmt.Errorf("%w: bad magic", ErrProtocol)
	}
	copy(h.nonce[:], b[len(magic):])
	name := make([]byte, b[len(b)-1])
	if _, err := io.ReadFull(r, name); err != nil {
		return h, fmt.Errorf("%w: hello: %v", ErrProtocol, err)
	}
	h.name = string(name)
	return h, nil
}

// sessionKeys derives the two directions' keys: the first for frames from
// the dialer, the second for frames from the listener.
func sessionKeys(key []byte, dialer, listener hello) (fromDialer, fromListener []byte, err error) {
	salt := append(append([]byte{}, dialer.nonce[:]...), listener.nonce[:]...)
	info := "nftgate gateway channel v1\x00" + dialer.name + "\x00" + listener.name
	k, err := hkdf.Key(sha256.New, key, salt, info, 2*chacha20poly1305.KeySize)
	if err != nil {
		return nil, nil, err
	}
	return k[:chacha20poly1305.KeySize], k[chacha20poly1305.KeySize:], nil
}

// handshakeParams are one end's part of a handshake.
type handshakeParams struct {
	key         []byte
	self        string
	setHash     [32]byte
	incarnation uint64
	// dialer: this end connected; expect is then the peer's name.
	dialer bool
	expect string
	// accept tells whether a listener accepts a peer of this name.
	accept func(name string) bool
}

// handshake authenticates nc; on error nc is left to the caller to close.
// The caller sets the deadline. claimed is the name the other end gave in
// its hello ("" before it), also on error.
func handshake(nc net.Conn, p handshakeParams) (c *conn, claimed string, err error) {
	c, err = handshake1(nc, p, &claimed)
	return c, claimed, err
}

func handshake1(nc net.Conn, p handshakeParams, claimed *string) (*conn, error) {
	mine := hello{name: p.self}
	if _, err := rand.Read(mine.nonce[:]); err != nil {
		return nil, err
	}
	if err := writeHello(nc, mine); err != nil {
		return nil, err
	}
	r := bufio.NewReader(nc)
	theirs, err := readHello(r)
	if err != nil {
		return nil, err
	}
	*claimed = theirs.name
	if p.dialer && theirs.name != p.expect {
		return nil, fmt.Errorf("%w: %q answered where %q was expected", ErrUnknownPeer, theirs.name, p.expect)
	}
	if !p.dialer && (p.accept == nil || !p.accept(theirs.name)) {
		return nil, fmt.Errorf("%w: %q", ErrUnknownPeer, theirs.name)
	}
	var kd, kl []byte
	if p.dialer {
		kd, kl, err = sessionKeys(p.key, mine, theirs)
	} else {
		kd, kl, err = sessionKeys(p.key, theirs, mine)
	}
	if err != nil {
		return nil, err
	}
	sk, ok := kd, kl
	if !p.dialer {
		sk, ok = kl, kd
	}
	c := &conn{nc: nc, r: r, peer: theirs.name}
	if c.seal, err = chacha20poly1305.New(sk); err != nil {
		return nil, err
	}
	if c.open, err = chacha20poly1305.New(ok); err != nil {
		return nil, err
	}
	auth := make([]byte, 40)
	copy(auth, p.setHash[:])
	binary.BigEndian.PutUint64(auth[32:], p.incarnation)
	if err := c.send(auth); err != nil {
		return nil, err
	}
	got, err := c.recv()
	if err != nil {
		if errors.Is(err, errOpen) {
			return nil, ErrBadKey
		}
		return nil, err
	}
	if len(got) != 40 {
		return nil, fmt.Errorf("%w: authentication frame of %d bytes", ErrProtocol, len(got))
	}
	if subtle.ConstantTimeCompare(got[:32], p.setHash[:]) != 1 {
		return nil, ErrSetDiffers
	}
	c.incarnation = binary.BigEndian.Uint64(got[32:])
	return c, nil
}

func counterNonce(n uint64) []byte {
	b := make([]byte, chacha20poly1305.NonceSize)
	binary.BigEndian.PutUint64(b[4:], n)
	return b
}

// send seals and writes one frame. Safe for concurrent use.
func (c *conn) send(msg []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n := len(msg) + c.seal.Overhead()
	if n > maxFrame {
		return fmt.Errorf("frame of %d bytes, at most %d", n, maxFrame)
	}
	c.wbuf = binary.BigEndian.AppendUint32(c.wbuf[:0], uint32(n))
	c.wbuf = c.seal.Seal(c.wbuf, counterNonce(c.sendCtr), msg, c.wbuf[:frameHead])
	c.sendCtr++
	_, err := c.nc.Write(c.wbuf)
	return err
}

// errOpen is a frame that does not authenticate.
var errOpen = errors.New("frame does not authenticate (wrong key, tampered or replayed)")

// recv reads and opens one frame. Not for concurrent use. The returned
// slice is valid until the next recv.
func (c *conn) recv() ([]byte, error) {
	var head [frameHead]byte
	if _, err := io.ReadFull(c.r, head[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n < uint32(c.open.Overhead()) || n > maxFrame {
		return nil, fmt.Errorf("%w: frame length %d", ErrProtocol, n)
	}
	if cap(c.rbuf) < int(n) {
		c.rbuf = make([]byte, n)
	}
	ct := c.rbuf[:n]
	if _, err := io.ReadFull(c.r, ct); err != nil {
		return nil, err
	}
	pt, err := c.open.Open(ct[:0], counterNonce(c.recvCtr), ct, head[:])
	if err != nil {
		return nil, errOpen
	}
	c.recvCtr++
	return pt, nil
}

func (c *conn) close() error { return c.nc.Close() }

// setDeadline bounds the next reads and writes.
func (c *conn) setReadDeadline(t time.Time) { _ = c.nc.SetReadDeadline(t) }
