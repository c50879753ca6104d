package appliance

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/crypto/bcrypt"
	"golang.org/x/time/rate"
	"k8s.io/utils/lru"
)

// Limits on failed logins: each client (an IPv4 address, or an IPv6 /64)
// may fail FailureBurst times in a row, then once per FailureEvery; past
// that it is answered 429 without its credentials being checked, so that
// guessing costs neither CPU (bcrypt) nor chances. The table of clients is
// bounded: the least recently seen are forgotten first.
const (
	FailureBurst   = 10
	FailureEvery   = 6 * time.Second
	FailureClients = 4096
)

// BasicAuth protects the status page and the JSON API with HTTP basic
// authentication. Health endpoints and /metrics stay open.
//
// A check costs the same whatever the user name: a wrong user is compared
// against a hash of the same cost as the real one, and names and digests
// are compared in constant time, so answers do not tell which user names
// exist. Failures are limited per client and logged (at most a few lines
// a second; the rest are counted).
type BasicAuth struct {
	user string
	// Exactly one of hash (bcrypt) and plain (sha256 of the password) is set.
	hash  []byte
	plain [sha256.Size]byte
	// dummy is a bcrypt hash of a random password with hash's cost, which
	// a wrong user name is compared against.
	dummy []byte

	// compare is bcrypt.CompareHashAndPassword; tests count its calls.
	compare func(hash, password []byte) error
	now     func() time.Time
	log     *slog.Logger

	// bcrypt is slow on purpose; a page polling every few seconds would pay
	// it on every request. Remember the digest of the last credentials that
	// passed bcrypt so repeated requests compare in constant time instead.
	mu       sync.Mutex
	verified [sha256.Size]byte
	haveOK   bool

	failures     *lru.Cache // client key -> *rate.Limiter
	failureBurst int
	failureEvery time.Duration
	logLimit     *rate.Limiter
	dropped      int // failure log lines not written since the last one; under mu
}

// NewBasicAuth accepts user with a bcrypt password hash, as written by
// `htpasswd -nbB user password` (the part after the colon) or `mkpasswd -m bcrypt`.
func NewBasicAuth(user, bcryptHash string) (*BasicAuth, error) {
	if err := checkUser(user); err != nil {
		return nil, err
	}
	if _, err := bcrypt.Cost([]byte(bcryptHash)); err != nil {
		return nil, fmt.Errorf("status auth password hash: not a bcrypt hash (want $2a$/$2b$/$2y$...): %v", err)
	}
	return newBasicAuth(user, []byte(bcryptHash), [sha256.Size]byte{})
}

// BasicAuthFromFile accepts user with the password kept in the file at path
// (surrounding white space, such as a trailing newline, is ignored). A file
// whose content is a bcrypt hash is taken as the hash.
func BasicAuthFromFile(user, path string) (*BasicAuth, error) {
	if err := checkUser(user); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("status auth password file %q: %w", path, err)
	}
	pw := strings.TrimSpace(string(b))
	if pw == "" {
		return nil, fmt.Errorf("status auth password file %q: empty", path)
	}
	if _, err := bcrypt.Cost([]byte(pw)); err == nil {
		return newBasicAuth(user, []byte(pw), [sha256.Size]byte{})
	}
	return newBasicAuth(user, nil, sha256.Sum256([]byte(pw)))
}

func newBasicAuth(user string, hash []byte, plain [sha256.Size]byte) (*BasicAuth, error) {
	a := &BasicAuth{
		user: user, hash: hash, plain: plain,
		compare: bcrypt.CompareHashAndPassword, now: time.Now, log: slog.New(slog.DiscardHandler),
		failures: lru.New(FailureClients), failureBurst: FailureBurst, failureEvery: FailureEvery,
		logLimit: rate.NewLimiter(rate.Every(time.Second), 5),
	}
	if hash != nil {
		cost, _ := bcrypt.Cost(hash)
		dummy, err := bcrypt.GenerateFromPassword([]byte(rand.Text()), cost)
		if err != nil {
			return nil, fmt.Errorf("status auth: %w", err)
		}
		a.dummy = dummy
	}
	return a, nil
}

// SetLogger sends the log lines of failed logins to log.
func (a *BasicAuth) SetLogger(log *slog.Logger) {
	if a != nil && log != nil {
		a.log = log
	}
}

func checkUser(user string) error {
	if user == "" {
		return fmt.Errorf("status auth user: must not be empty")
	}
	if strings.ContainsAny(user, ":\r\n") {
		return fmt.Errorf("status auth user %q: must not contain ':' or line breaks", user)
	}
	return nil
}

// Check reports whether user and password are the configured credentials.
// It costs the same for any wrong user name as for the right one.
func (a *BasicAuth) Check(user, password string) bool {
	userOK := subtle.ConstantTimeCompare([]byte(user), []byte(a.user)) == 1
	if a.hash == nil {
		pwSum := sha256.Sum256([]byte(password))
		pwOK := subtle.ConstantTimeCompare(pwSum[:], a.plain[:]) == 1
		return userOK && pwOK
	}
	if a.cached(user, password) {
		return true
	}
	// One bcrypt comparison either way: against the real hash for the
	// right user, against a hash of the same cost for any other.
	hash := a.dummy
	if userOK {
		hash = a.hash
	}
	if a.compare(hash, []byte(password)) != nil || !userOK {
		return false
	}
	digest := credentialDigest(user, password)
	a.mu.Lock()
	a.verified, a.haveOK = digest, true
	a.mu.Unlock()
	return true
}

func credentialDigest(user, password string) [sha256.Size]byte {
	return sha256.Sum256([]byte(user + ":" + password))
}

// cached reports whether user and password are the last credentials that
// passed bcrypt.
func (a *BasicAuth) cached(user, password string) bool {
	if a.hash == nil {
		return false
	}
	digest := credentialDigest(user, password)
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.haveOK && subtle.ConstantTimeCompare(digest[:], a.verified[:]) == 1
}

// clientKey is what failures are counted by: the client's address, or its
// /64 for IPv6, where one host commonly holds a whole /64.
func clientKey(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	addr = addr.Unmap().WithZone("")
	if addr.Is6() {
		return netip.PrefixFrom(addr, 64).Masked().String()
	}
	return addr.String()
}

// limited reports whether client has used up its failures, and if so how
// long until its next attempt.
func (a *BasicAuth) limited(client string, now time.Time) (bool, time.Duration) {
	v, ok := a.failures.Get(client)
	if !ok {
		return false, 0
	}
	tokens := v.(*rate.Limiter).TokensAt(now)
	if tokens >= 1 {
		return false, 0
	}
	return true, time.Duration((1 - tokens) * float64(a.failureEvery))
}

// failed counts a failure of client.
func (a *BasicAuth) failed(client string, now time.Time) {
	v, ok := a.failures.Get(client)
	if !ok {
		v = rate.NewLimiter(rate.Every(a.failureEvery), a.failureBurst)
		a.failures.Add(client, v)
	}
	v.(*rate.Limiter).AllowN(now, 1)
}

// logFailure logs a failed or refused login, at most a few lines a second;
// lines left out are counted in the next.
func (a *BasicAuth) logFailure(now time.Time, msg, client, user string) {
	a.mu.Lock()
	if !a.logLimit.AllowN(now, 1) {
		a.dropped++
		a.mu.Unlock()
		return
	}
	dropped := a.dropped
	a.dropped = 0
	a.mu.Unlock()
	attrs := []any{"client", client, "user", logUser(user)}
	if dropped > 0 {
		attrs = append(attrs, "not_logged_since_last", dropped)
	}
	a.log.Warn(msg, attrs...)
}

// logUser shortens a user name for the log; the handler quotes it.
func logUser(u string) string {
	const limit = 64
	if len(u) <= limit {
		return u
	}
	for i := limit; i > 0; i-- {
		if utf8.RuneStart(u[i]) {
			return u[:i] + "…"
		}
	}
	return ""
}

// authorize answers the request itself (401 or 429) unless it carries the
// configured credentials.
func (a *BasicAuth) authorize(w http.ResponseWriter, r *http.Request) bool {
	user, pw, ok := r.BasicAuth()
	// The limit comes first, also for credentials that would pass:
	// otherwise a limited client's right guess would still get in.
	now := a.now()
	client := clientKey(r.RemoteAddr)
	if limited, wait := a.limited(client, now); limited {
		a.logFailure(now, "login refused: too many failed logins from this client", r.RemoteAddr, user)
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		http.Error(w, "too many failed logins; try again later", http.StatusTooManyRequests)
		return false
	}
	if ok && a.Check(user, pw) {
		return true
	}
	if ok { // a request without credentials is a browser's first, not a failure
		a.failed(client, now)
		a.logFailure(now, "login failed", r.RemoteAddr, user)
	}
	w.Header().Set("WWW-Authenticate", `Basic realm="nftgate", charset="UTF-8"`)
	http.Error(w, "authentication required", http.StatusUnauthorized)
	return false
}

func (a *BasicAuth) wrap(h http.Handler) http.Handler {
	if a == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.authorize(w, r) {
			h.ServeHTTP(w, r)
		}
	})
}
