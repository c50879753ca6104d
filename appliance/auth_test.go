package appliance

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// countingAuth is BasicAuth for "admin" with a bcrypt hash, whose bcrypt
// comparisons are counted by the cost of the hash compared against, and
// whose clock and log the test holds.
type countingAuth struct {
	*BasicAuth
	mu    sync.Mutex
	costs []int
	now   time.Time
	log   bytes.Buffer
}

func newCountingAuth(t *testing.T, password string) *countingAuth {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost+1)
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewBasicAuth("admin", string(hash))
	if err != nil {
		t.Fatal(err)
	}
	c := &countingAuth{BasicAuth: a, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a.compare = func(hash, pw []byte) error {
		cost, err := bcrypt.Cost(hash)
		if err != nil {
			t.Errorf("compared against a non-bcrypt hash %q", hash)
		}
		c.mu.Lock()
		c.costs = append(c.costs, cost)
		c.mu.Unlock()
		return bcrypt.CompareHashAndPassword(hash, pw)
	}
	a.now = func() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
	a.SetLogger(slog.New(slog.NewTextHandler(&c.log, nil)))
	return c
}

func (c *countingAuth) compared() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.costs
	c.costs = nil
	return out
}

func (c *countingAuth) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// do sends GET /api/v1/status from client (host:port) with credentials
// (none when user is empty) through the server's handler.
func (c *countingAuth) do(t *testing.T, h http.Handler, client, user, pw string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest("GET", "/api/v1/status", nil)
	req.RemoteAddr = client
	if user != "" {
		req.SetBasicAuth(user, pw)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestAuthCostIsTheSameForAnyUser: a wrong user name costs one bcrypt
// comparison of the configured cost, as a wrong password for the right
// user does, so the time of an answer does not tell which names exist.
func TestAuthCostIsTheSameForAnyUser(t *testing.T) {
	a := newCountingAuth(t, "right")
	want := fmt.Sprint([]int{bcrypt.MinCost + 1})
	for _, c := range []struct{ user, pw string }{
		{"admin", "wrong"}, {"nobody", "wrong"}, {"", "wrong"}, {"admi", "right"}, {"adminx", "right"},
		{strings.Repeat("a", 10000), "right"}, {"ADMIN", "right"},
	} {
		if a.Check(c.user, c.pw) {
			t.Errorf("Check(%q, %q) = true", c.user, c.pw)
		}
		if got := fmt.Sprint(a.compared()); got != want {
			t.Errorf("Check(%.20q, %q): bcrypt comparisons at costs %s, want %s", c.user, c.pw, got, want)
		}
	}
	if !a.Check("admin", "right") {
		t.Fatal("the right credentials fail")
	}
	if got := fmt.Sprint(a.compared()); got != want {
		t.Errorf("right credentials: bcrypt comparisons at costs %s, want %s", got, want)
	}
	// Then the verified credentials are remembered: no bcrypt.
	if !a.Check("admin", "right") || len(a.compared()) != 0 {
		t.Error("verified credentials are compared with bcrypt again")
	}
	// The same through HTTP.
	h := NewServer(Options{Source: &fakeSource{snap: healthySnapshot()}, Auth: a.BasicAuth})
	for _, user := range []string{"admin", "root"} {
		if rec := a.do(t, h, "192.0.2.1:40000", user, "nope"); rec.Code != 401 {
			t.Errorf("%s with a wrong password: %d, want 401", user, rec.Code)
		}
		if got := fmt.Sprint(a.compared()); got != want {
			t.Errorf("%s over HTTP: bcrypt comparisons at costs %s, want %s", user, got, want)
		}
	}
}

// TestAuthFailuresAreLimited: a client that fails FailureBurst times is
// answered 429, without a bcrypt comparison, even with the right password,
// until time returns it an attempt; other clients are not affected; an
// IPv6 client's whole /64 counts as one.
func TestAuthFailuresAreLimited(t *testing.T) {
	a := newCountingAuth(t, "right")
	h := NewServer(Options{Source: &fakeSource{snap: healthySnapshot()}, Auth: a.BasicAuth})
	const attacker, other = "198.51.100.7:51000", "198.51.100.8:52000"
	for i := range FailureBurst {
		if rec := a.do(t, h, attacker, "admin", fmt.Sprint("guess", i)); rec.Code != 401 {
			t.Fatalf("failure %d: %d, want 401", i+1, rec.Code)
		}
	}
	a.compared()
	for _, pw := range []string{"guess", "right"} {
		rec := a.do(t, h, attacker, "admin", pw)
		if rec.Code != http.StatusTooManyRequests {
			t.Fatalf("after %d failures, password %q: %d, want 429", FailureBurst, pw, rec.Code)
		}
		if ra := rec.Header().Get("Retry-After"); ra != fmt.Sprint(int(FailureEvery.Seconds())) {
			t.Errorf("Retry-After %q, want %v", ra, FailureEvery.Seconds())
		}
	}
	if n := len(a.compared()); n != 0 {
		t.Errorf("a limited client cost %d bcrypt comparisons", n)
	}
	if rec := a.do(t, h, other, "admin", "right"); rec.Code != 200 {
		t.Errorf("another client with the right password: %d, want 200", rec.Code)
	}
	// Time gives back one attempt per FailureEvery.
	a.advance(FailureEvery - time.Millisecond)
	if rec := a.do(t, h, attacker, "admin", "wrong"); rec.Code != 429 {
		t.Errorf("just before FailureEvery: %d, want 429", rec.Code)
	}
	a.advance(time.Millisecond)
	if rec := a.do(t, h, attacker, "admin", "wrong"); rec.Code != 401 {
		t.Errorf("after FailureEvery, a wrong password: %d, want 401", rec.Code)
	}
	if rec := a.do(t, h, attacker, "admin", "right"); rec.Code != 429 {
		t.Errorf("the attempt given back was used: %d, want 429", rec.Code)
	}
	a.advance(FailureEvery * FailureBurst)
	if rec := a.do(t, h, attacker, "admin", "right"); rec.Code != 200 {
		t.Errorf("recovered client with the right password: %d, want 200", rec.Code)
	}

	// IPv6: addresses of one /64 share a bucket; another /64 does not.
	for i := range FailureBurst {
		a.do(t, h, fmt.Sprintf("[2001:db8:1:2::%x]:443", i+1), "x", "y")
	}
	if rec := a.do(t, h, "[2001:db8:1:2:ffff::1]:443", "x", "y"); rec.Code != 429 {
		t.Errorf("same /64: %d, want 429", rec.Code)
	}
	if rec := a.do(t, h, "[2001:db8:1:3::1]:443", "x", "y"); rec.Code != 401 {
		t.Errorf("another /64: %d, want 401", rec.Code)
	}
}

// TestAuthFailuresAreLogged: failures are logged with the client and user,
// at most a few lines at a time; those left out are counted in the next.
func TestAuthFailuresAreLogged(t *testing.T) {
	a := newCountingAuth(t, "right")
	a.compare = func(hash, pw []byte) error { return bcrypt.ErrMismatchedHashAndPassword }
	h := NewServer(Options{Source: &fakeSource{snap: healthySnapshot()}, Auth: a.BasicAuth})
	a.do(t, h, "203.0.113.9:1000", "mallory\nforged=1", "x")
	log := a.log.String()
	if !strings.Contains(log, `msg="login failed" client=203.0.113.9:1000 user="mallory\nforged=1"`) {
		t.Errorf("log %q lacks the failure with client and quoted user", log)
	}
	for i := range 200 {
		a.do(t, h, fmt.Sprintf("203.0.113.%d:1000", 10+i%100), "u", "x")
	}
	if n := strings.Count(a.log.String(), "\n"); n > 10 {
		t.Errorf("200 failures at one instant wrote %d log lines", n)
	}
	a.advance(time.Minute)
	a.do(t, h, "203.0.113.9:1000", "u", "x")
	lines := strings.Split(strings.TrimSpace(a.log.String()), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, "not_logged_since_last=") {
		t.Errorf("the line after a burst does not count what was left out: %q", last)
	}
}

// TestAuthClientTableIsBounded: many clients never grow the table past
// FailureClients.
func TestAuthClientTableIsBounded(t *testing.T) {
	a := newCountingAuth(t, "right")
	a.compare = func(hash, pw []byte) error { return bcrypt.ErrMismatchedHashAndPassword }
	h := NewServer(Options{Source: &fakeSource{snap: healthySnapshot()}, Auth: a.BasicAuth})
	for i := range FailureClients + 100 {
		a.do(t, h, fmt.Sprintf("10.%d.%d.%d:1", i>>16&255, i>>8&255, i&255), "u", "x")
	}
	if n := a.failures.Len(); n > FailureClients {
		t.Errorf("%d clients in the table, bound %d", n, FailureClients)
	}
}
