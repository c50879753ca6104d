package appliance

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const testUser, testPassword = "admin", "drain-test-password"

type fakeDrainer struct {
	mu      sync.Mutex
	st      DrainState
	reasons []string
}

func (f *fakeDrainer) StartDrain(reason string) DrainState {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reasons = append(f.reasons, reason)
	if f.st.State == DrainServing {
		f.st = DrainState{State: DrainDraining, Reason: reason, Since: fixtureNow, Deadline: fixtureNow.Add(30 * time.Second), OpenFlows: 3}
	}
	return f.st
}

func (f *fakeDrainer) DrainState() DrainState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}

// POST /api/v1/drain starts a drain only with a JSON body (a page of
// another site cannot send one without a preflight), behind the
// authentication; once draining, /readyz fails and says why.
func TestDrainEndpointAndReadyz(t *testing.T) {
	d := &fakeDrainer{st: DrainState{State: DrainServing}}
	pw := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pw, []byte(testPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth, err := BasicAuthFromFile(testUser, pw)
	if err != nil {
		t.Fatal(err)
	}
	ts, _ := newTestServer(t, healthySnapshot(), Options{Drain: d, Auth: auth})
	post := func(ct string, user bool) int {
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/api/v1/drain", strings.NewReader("{}"))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		if user {
			req.SetBasicAuth(testUser, testPassword)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("application/json", false); code != http.StatusUnauthorized {
		t.Errorf("POST without credentials: %d", code)
	}
	if code := post("application/x-www-form-urlencoded", true); code != http.StatusUnsupportedMediaType {
		t.Errorf("POST as a form: %d", code)
	}
	if code, _, _ := get(t, ts.URL+"/readyz"); code != http.StatusOK || len(d.reasons) != 0 {
		t.Fatalf("/readyz before the drain: %d, drains started: %v", code, d.reasons)
	}
	if code := post("application/json; charset=utf-8", true); code != http.StatusAccepted {
		t.Errorf("POST: %d", code)
	}
	code, _, b := get(t, ts.URL+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.HasPrefix(string(b), "draining: 3 open flows, until ") {
		t.Errorf("/readyz while draining: %d %q", code, b)
	}
	if len(d.reasons) != 1 || d.reasons[0] != "api" {
		t.Errorf("drains started: %v", d.reasons)
	}
}
