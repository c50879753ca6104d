package appliance

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"embed"
	"encoding/json"
	"html/template"
	"io"
	"io/fs"
	"iter"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// DefaultMaxSyncAge is how old the last successful sync may be before
// /healthz fails, when Options.MaxSyncAge is zero.
const DefaultMaxSyncAge = 2 * time.Minute

// DefaultRefresh is how often the status page polls the API.
const DefaultRefresh = 2 * time.Second

// Options configure NewServer.
type Options struct {
	// Source supplies the data shown; required.
	Source Source
	// Metrics is served on /metrics; nil serves a registry with only the Go
	// and process collectors.
	Metrics *Metrics
	// MaxSyncAge bounds the age of the last successful sync for /healthz;
	// zero means DefaultMaxSyncAge, negative disables the check.
	MaxSyncAge time.Duration
	// Auth, when set, protects the page, its assets, /api/ and
	// /debug/pprof/.
	Auth *BasicAuth
	// AllowedHosts are the host names (besides IP literals and localhost)
	// a request's Host header may carry when there is no Auth; others are
	// answered 421, so that a web page cannot read the API through a name
	// it rebinds to this server's address (DNS rebinding).
	AllowedHosts []string
	// Pprof serves Go's profiler under /debug/pprof/, behind Auth.
	Pprof bool
	// Edge, when set, gives what GET /api/v1/edge answers: the addresses
	// of the Services, their pools and announcement, the BGP sessions and
	// the pools' use (any JSON-encodable value). Nil: the endpoint answers
	// 404.
	Edge func() any
	// Drain, when set, serves GET and POST /api/v1/drain (behind Auth),
	// makes /readyz fail once a drain started, and shows the drain on the
	// page. Nil: the endpoint answers 404.
	Drain Drainer
	// Gateways, when set, gives what GET /api/v1/gateways answers: the
	// gateway set's peers, their channel and the addresses each holds.
	// Nil: the endpoint answers 404.
	Gateways func() any
	// StateSync, when set, gives what GET /api/v1/statesync answers: the
	// connection-state sync with each peer gateway. Nil: 404.
	StateSync func() any
	// Traffic, when set, serves GET /api/v1/traffic and the flows of each
	// Service. Nil: those answer 404.
	Traffic Traffic
	// History, when set with Traffic, serves GET /api/v1/traffic/history
	// and the charts of the page. Its Run must be started by the caller.
	History *History
	// Events, when set, serves GET /api/v1/events and the page's timeline.
	Events *Events
	// Refresh is the page's polling interval; zero means DefaultRefresh.
	Refresh time.Duration
	// Logger receives request errors; nil discards them.
	Logger *slog.Logger
	// Now is the clock, for tests; nil means time.Now.
	Now func() time.Time
}

//go:embed web
var webFS embed.FS

var pageTemplate = template.Must(template.New("index.html").Funcs(template.FuncMap{
	"ago": func(now, t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return humanDuration(now.Sub(t)) + " ago"
	},
}).ParseFS(webFS, "web/index.html"))

type server struct {
	opts    Options
	maxAge  time.Duration
	metrics *Metrics
	log     *slog.Logger
	rates   rates
}

// NewServer returns the handler for the gateway's HTTP listener:
//
//	/                                    status page (auth)
//	/assets/                             its CSS and JavaScript (auth)
//	/api/v1/status                       JSON status (auth)
//	/api/v1/services                     JSON Services, ?q=&namespace=&type= filter, ?limit= (auth)
//	/api/v1/services/{namespace}/{name}  one Service (auth)
//	/api/v1/syncs                        recent syncs (auth)
//	/api/v1/traffic                      counters per Service port, ?sort=, with Options.Traffic (auth)
//	/api/v1/services/{ns}/{name}/flows   live flows, ?client=&q=&limit=, with Options.Traffic (auth)
//	/api/v1/traffic/history              the last hour per Service port, with Options.History (auth)
//	/api/v1/events                       the gateway's timeline, ?kind=&limit=, with Options.Events (auth)
//	/api/v1/drain                        drain state; POST starts a drain, with Options.Drain (auth)
//	/healthz, /livez, /readyz            probes (open)
//	/metrics                             Prometheus (open)
//	/debug/pprof/                        Go's profiler, with Options.Pprof (auth)
//
// Without Auth, requests must name the server by an IP address, localhost
// or one of Options.AllowedHosts (421 otherwise).
//
// It panics when opts.Source is nil, a programming error.
func NewServer(opts Options) http.Handler {
	if opts.Source == nil {
		panic("appliance.NewServer: Options.Source is nil")
	}
	s := &server{opts: opts, maxAge: opts.MaxSyncAge, metrics: opts.Metrics, log: opts.Logger}
	if s.maxAge == 0 {
		s.maxAge = DefaultMaxSyncAge
	}
	if s.opts.Refresh <= 0 {
		s.opts.Refresh = DefaultRefresh
	}
	if s.opts.Now == nil {
		s.opts.Now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	var metricsHandler http.Handler
	if s.metrics != nil {
		metricsHandler = s.metrics.Handler()
	} else {
		metricsHandler = NewMetrics("unknown").Handler()
	}

	assets, err := fs.Sub(webFS, "web/assets")
	if err != nil {
		panic(err)
	}
	if opts.Logger != nil {
		opts.Auth.SetLogger(opts.Logger)
	}
	auth := opts.Auth.wrap
	mux := http.NewServeMux()
	// authed registers a handler behind the authentication.
	authed := func(pattern string, f http.HandlerFunc) { mux.Handle(pattern, auth(f)) }
	authed("GET /{$}", s.page)
	mux.Handle("GET /assets/", auth(http.StripPrefix("/assets/", staticHeaders(http.FileServerFS(assets)))))
	authed("GET /api/v1/status", s.status)
	authed("GET /api/v1/services", s.services)
	authed("GET /api/v1/services/{namespace}/{name}", s.service)
	authed("GET /api/v1/syncs", s.syncs)
	if opts.Edge != nil {
		authed("GET /api/v1/edge", s.edge)
	}
	if opts.Drain != nil {
		authed("GET /api/v1/drain", s.drainGet)
		authed("POST /api/v1/drain", s.drainPost)
	}
	if opts.Gateways != nil {
		authed("GET /api/v1/gateways", s.gateways)
	}
	if opts.StateSync != nil {
		authed("GET /api/v1/statesync", s.stateSync)
	}
	if opts.Traffic != nil {
		authed("GET /api/v1/traffic", s.traffic)
		authed("GET /api/v1/services/{namespace}/{name}/flows", s.flows)
		if opts.History != nil {
			authed("GET /api/v1/traffic/history", s.history)
		}
	}
	if opts.Events != nil {
		authed("GET /api/v1/events", s.events)
	}
	authed("/api/", s.apiNotFound)
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /livez", s.livez)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("GET /metrics", metricsHandler)
	if opts.Pprof {
		authed("/debug/pprof/", pprof.Index)
		authed("/debug/pprof/cmdline", pprof.Cmdline)
		authed("/debug/pprof/profile", pprof.Profile)
		authed("/debug/pprof/symbol", pprof.Symbol)
		authed("/debug/pprof/trace", pprof.Trace)
	}
	var h http.Handler = mux
	if opts.Auth == nil {
		h = hostCheck(h, opts.AllowedHosts)
	}
	return securityHeaders(h)
}

// hostCheck answers 421 to a request whose Host header is not an IP
// literal, localhost, or one of allowed (compared without case and
// trailing dot). A request without Host (HTTP/1.0 health checkers) passes:
// browsers always send one.
func hostCheck(h http.Handler, allowed []string) http.Handler {
	names := map[string]bool{"localhost": true}
	for _, n := range allowed {
		names[normalHost(n)] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hostAllowed(r.Host, names) {
			http.Error(w, "unknown host name "+strconv.Quote(r.Host)+
				": without authentication only IP addresses, localhost and the names in http_allowed_hosts are served",
				http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// hostAllowed reports whether a Host header value (host, host:port,
// [v6]:port) is empty, an IP literal, or a name in names (normalized with
// normalHost).
func hostAllowed(host string, names map[string]bool) bool {
	if host == "" {
		return true
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	return names[normalHost(host)]
}

func normalHost(h string) string { return strings.ToLower(strings.TrimSuffix(h, ".")) }

// securityHeaders keeps the page self-contained: it may load nothing from
// anywhere but this server, and no other site may frame it.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; "+
			"img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		h.ServeHTTP(w, r)
	})
}

func staticHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The assets are part of the binary; a reload after an upgrade must
		// not mix old JavaScript with a new API, so let browsers revalidate.
		w.Header().Set("Cache-Control", "no-cache")
		h.ServeHTTP(w, r)
	})
}

type pageData struct {
	Now       time.Time
	Snap      Snapshot
	Status    StatusJSON
	RefreshMS int64
	Title     string
	Edge      bool // GET /api/v1/edge answers
	Drain     bool // GET /api/v1/drain answers
	Gateways  bool // GET /api/v1/gateways answers
	StateSync bool // GET /api/v1/statesync answers
	Traffic   bool // GET /api/v1/traffic answers
	History   bool // GET /api/v1/traffic/history answers
	Events    bool // GET /api/v1/events answers
}

func (s *server) page(w http.ResponseWriter, r *http.Request) {
	now := s.opts.Now()
	snap := s.opts.Source.Snapshot()
	d := pageData{
		Now: now, Snap: snap, Status: statusJSON(snap, now, s.maxAge),
		RefreshMS: s.opts.Refresh.Milliseconds(), Title: "nftgate", Edge: s.opts.Edge != nil, Drain: s.opts.Drain != nil,
		Gateways: s.opts.Gateways != nil, StateSync: s.opts.StateSync != nil,
		Traffic: s.opts.Traffic != nil, History: s.opts.Traffic != nil && s.opts.History != nil, Events: s.opts.Events != nil,
	}
	if snap.Identity.NodeName != "" {
		d.Title = "nftgate · " + snap.Identity.NodeName
	}
	var buf bytes.Buffer
	if err := pageTemplate.Execute(&buf, d); err != nil {
		s.log.Error("render status page", "err", err)
		http.Error(w, "internal error rendering the status page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(buf.Bytes())
}

func (s *server) writeJSON(w http.ResponseWriter, r *http.Request, code int, v any) {
	s.writeJSONIndent(w, r, code, v, true)
}

// writeJSONIndent indents small answers for people using curl; the full
// Service list goes out compact, as it runs to megabytes at 10,000 Services.
func (s *server) writeJSONIndent(w http.ResponseWriter, r *http.Request, code int, v any, indent bool) {
	var b []byte
	var err error
	if indent {
		b, err = json.MarshalIndent(v, "", "  ")
	} else {
		b, err = json.Marshal(v)
	}
	if err != nil {
		s.log.Error("encode API response", "err", err)
		code, b = http.StatusInternalServerError, []byte(`{"error":"internal error encoding the response"}`)
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Add("Vary", "Accept-Encoding")
	// A large Service list compresses about tenfold; small answers are not
	// worth the CPU.
	if len(b) > 16<<10 && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(code)
		zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
		_, _ = zw.Write(b)
		_ = zw.Close()
		return
	}
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// writeJSONList writes a long list, the Services or the traffic
// counters at 10,000 Services, element by element into the (gzip) stream,
// never holding the whole answer or a slice of the converted elements: in
// a process near its memory limit, megabytes of garbage a request cost
// more in the collector than the encoding itself. head is the answer with
// the list, its last field, named field and left nil; items are the
// list's elements in order.
func (s *server) writeJSONList(w http.ResponseWriter, r *http.Request, head any, field string, items iter.Seq[any]) {
	open, err := json.Marshal(head)
	null := []byte(strconv.Quote(field) + ":null}")
	if err != nil || !bytes.HasSuffix(open, null) {
		s.log.Error("encode API response", "err", err, "field", field)
		s.writeJSON(w, r, http.StatusInternalServerError, ErrorJSON{Error: "internal error encoding the response"})
		return
	}
	open = append(open[:len(open)-len(null)], strconv.Quote(field)+":["...)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Add("Vary", "Accept-Encoding")
	var out io.Writer = w
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		w.Header().Set("Content-Encoding", "gzip")
		zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
		defer zw.Close()
		out = zw
	}
	sent := &writeErr{w: out}
	bw := bufio.NewWriterSize(sent, 32<<10)
	defer bw.Flush()
	w.WriteHeader(http.StatusOK)
	_, _ = bw.Write(open)
	enc := json.NewEncoder(bw)
	first := true
	for v := range items {
		if !first {
			_ = bw.WriteByte(',')
		}
		first = false
		if err := enc.Encode(v); err != nil {
			if sent.err != nil { // the client went away
				s.log.Debug("API response not sent", "path", r.URL.Path, "err", err)
				return
			}
			// Too late for another status: the answer ends malformed.
			s.log.Error("encode API response", "err", err)
			return
		}
	}
	_, _ = bw.WriteString("]}\n")
}

// writeErr keeps the first error of the writes to w.
type writeErr struct {
	w   io.Writer
	err error
}

func (e *writeErr) Write(b []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(b)
	e.err = err
	return n, err
}

func (s *server) status(w http.ResponseWriter, r *http.Request) {
	now := s.opts.Now()
	s.writeJSON(w, r, http.StatusOK, statusJSON(s.opts.Source.Snapshot(), now, s.maxAge))
}

// serviceFilter is the query of GET /api/v1/services.
type serviceFilter struct {
	q         string // case-insensitive substring of namespace/name, IPs, ports, node
	namespace string
	typ       string
}

func (f serviceFilter) match(svc *Service) bool {
	if f.namespace != "" && svc.Namespace != f.namespace {
		return false
	}
	if f.typ != "" && !strings.EqualFold(svc.Type, f.typ) {
		return false
	}
	if f.q == "" {
		return true
	}
	return strings.Contains(strings.ToLower(serviceSearchText(svc)), f.q)
}

// serviceSearchText is what the free-text filter looks in; the page's own
// filter (web/assets/app.js) searches the same fields.
func serviceSearchText(svc *Service) string {
	var b strings.Builder
	b.WriteString(svc.Namespace + "/" + svc.Name + " " + svc.Type)
	for _, a := range svc.ClusterIPs {
		b.WriteString(" " + a.String())
	}
	for _, a := range svc.ExternalIPs {
		b.WriteString(" " + a.String())
	}
	for _, a := range svc.LoadBalancerIPs {
		b.WriteString(" " + a.String())
	}
	for _, p := range svc.Ports {
		b.WriteString(" " + strconv.Itoa(int(p.Port)) + "/" + p.Protocol + " " + p.Name)
		if p.NodePort != 0 {
			b.WriteString(" " + strconv.Itoa(int(p.NodePort)))
		}
	}
	for _, e := range svc.EndpointList() {
		b.WriteString(" " + e.Addr.String() + " " + e.Node)
	}
	return b.String()
}

func (s *server) services(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := serviceFilter{
		q:         strings.ToLower(strings.TrimSpace(q.Get("q"))),
		namespace: q.Get("namespace"),
		typ:       q.Get("type"),
	}
	limit := -1
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			s.writeJSON(w, r, http.StatusBadRequest, ErrorJSON{Error: "limit: " + strconv.Quote(v) + " is not a positive number"})
			return
		}
		limit = n
	}
	snap := s.opts.Source.Snapshot()
	// Without a filter every Service matches, and with a limit only the
	// first rows are made (the list makes each row as it is read).
	all := f == serviceFilter{}
	var matched []*Service
	for svc := range snap.Services.All() { // in name order
		if all && limit >= 0 && len(matched) == limit {
			break
		}
		if f.match(svc) {
			matched = append(matched, svc)
		}
	}
	head := ServiceListJSON{Revision: snap.Sync.ServicesRevision, Total: snap.Services.Len(), Matched: len(matched)}
	if all {
		head.Matched = head.Total
	}
	if limit >= 0 && len(matched) > limit {
		matched = matched[:limit]
	}
	if len(matched) <= 50 {
		head.Services = make([]ServiceJSON, 0, len(matched))
		for _, svc := range matched {
			head.Services = append(head.Services, serviceJSON(svc))
		}
		s.writeJSON(w, r, http.StatusOK, head)
		return
	}
	s.writeJSONList(w, r, head, "services", func(yield func(any) bool) {
		for _, svc := range matched {
			if !yield(serviceJSON(svc)) {
				return
			}
		}
	})
}

func (s *server) service(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	snap := s.opts.Source.Snapshot()
	if svc, ok := snap.Services.Get(ns, name); ok {
		s.writeJSON(w, r, http.StatusOK, serviceJSON(svc))
		return
	}
	s.writeJSON(w, r, http.StatusNotFound, ErrorJSON{Error: "service " + strconv.Quote(ns+"/"+name) + " not found"})
}

func (s *server) syncs(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, r, http.StatusOK, syncsJSON(s.opts.Source.Snapshot()))
}

func (s *server) edge(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, r, http.StatusOK, s.opts.Edge())
}

func (s *server) gateways(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, r, http.StatusOK, s.opts.Gateways())
}

func (s *server) stateSync(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, r, http.StatusOK, s.opts.StateSync())
}

func (s *server) apiNotFound(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		s.writeJSON(w, r, http.StatusMethodNotAllowed, ErrorJSON{Error: "the API is read-only: method " + r.Method + " not allowed"})
		return
	}
	s.writeJSON(w, r, http.StatusNotFound, ErrorJSON{Error: "no API endpoint " + strconv.Quote(r.URL.Path)})
}

func (s *server) probe(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(body + "\n"))
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	ok, reason := Health(s.opts.Source.Snapshot(), s.opts.Now(), s.maxAge)
	code := http.StatusOK
	if !ok {
		code = http.StatusServiceUnavailable
	}
	if s.metrics != nil {
		s.metrics.countProbe(s.metrics.healthzTotal, code)
	}
	s.probe(w, code, reason)
}

func (s *server) livez(w http.ResponseWriter, r *http.Request) {
	if s.metrics != nil {
		s.metrics.countProbe(s.metrics.livezTotal, http.StatusOK)
	}
	s.probe(w, http.StatusOK, "ok")
}

func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	if !s.opts.Source.Snapshot().Sync.FirstSyncDone {
		s.probe(w, http.StatusServiceUnavailable, "first sync not done yet")
		return
	}
	if s.opts.Drain != nil {
		if d := s.opts.Drain.DrainState(); d.State != DrainServing {
			s.probe(w, http.StatusServiceUnavailable, d.State+": "+strconv.Itoa(d.OpenFlows)+" open flows, until "+d.Deadline.UTC().Format(time.RFC3339))
			return
		}
	}
	s.probe(w, http.StatusOK, "ok")
}

// humanDuration prints d coarsely, the way a person reads an age.
func humanDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	case d < time.Hour:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m" + strconv.FormatInt(int64(d%time.Minute/time.Second), 10) + "s"
	case d < 48*time.Hour:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h" + strconv.FormatInt(int64(d%time.Hour/time.Minute), 10) + "m"
	}
	return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
}
