package appliance

import (
	"mime"
	"net/http"
	"net/netip"
	"strconv"
	"time"
)

// Drain states.
const (
	// DrainServing: the gateway announces its addresses and takes new
	// connections.
	DrainServing = "serving"
	// DrainDraining: its announcements are withdrawn; it forwards the
	// flows it still has until they end or the period is over.
	DrainDraining = "draining"
	// DrainDrained: the drain is over; nftgate exits.
	DrainDrained = "drained"
)

// DrainState is the gateway's drain, as GET and POST /api/v1/drain answer
// it, /readyz reports it and the page shows it.
type DrainState struct {
	State string `json:"state"`
	// Reason started the drain: "api" (nftgate drain) or the signal.
	Reason string `json:"reason,omitempty"`
	// Since the drain started, and the end of its period.
	Since    time.Time `json:"since,omitzero"`
	Deadline time.Time `json:"deadline,omitzero"`
	// OpenFlows are the flows to the withdrawn addresses still open at the
	// last count; Withdrawn those addresses.
	OpenFlows int          `json:"openFlows"`
	Withdrawn []netip.Addr `json:"withdrawn,omitempty"`
}

// Drainer starts a drain and tells its state (Options.Drain).
type Drainer interface {
	// StartDrain starts a drain for reason, once; later calls change
	// nothing. It returns the state after the call.
	StartDrain(reason string) DrainState
	DrainState() DrainState
}

func (s *server) drainGet(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, r, http.StatusOK, s.opts.Drain.DrainState())
}

// drainPost starts a drain. It takes only a JSON body: a browser sends
// that cross-site only after a CORS preflight, which this server never
// grants, so no other web page can drain the gateway through a visitor's
// browser (with or without its credentials).
func (s *server) drainPost(w http.ResponseWriter, r *http.Request) {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		s.writeJSON(w, r, http.StatusUnsupportedMediaType, ErrorJSON{Error: "POST /api/v1/drain takes Content-Type application/json, got " + strconv.Quote(r.Header.Get("Content-Type"))})
		return
	}
	s.writeJSON(w, r, http.StatusAccepted, s.opts.Drain.StartDrain("api"))
}
