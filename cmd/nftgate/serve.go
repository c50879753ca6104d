package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/appliance"
	"github.com/nftgate/nftgate/appliance/httpserver"
	"github.com/nftgate/nftgate/appliance/notify"
	"github.com/nftgate/nftgate/conntrack"
	"github.com/nftgate/nftgate/healthcheck"
	"github.com/nftgate/nftgate/hostaddr"
	"github.com/nftgate/nftgate/ipam"
	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/memlimit"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/nft"
	"github.com/nftgate/nftgate/podroutes"
	"github.com/nftgate/nftgate/ruleset"
	"github.com/nftgate/nftgate/source"
	"github.com/nftgate/nftgate/status"
)

func (c *Config) ruleset() ruleset.Config {
	return ruleset.Config{
		Table:                 c.Table,
		Node:                  model.Node{Name: c.NodeName, Zone: c.Zone},
		ClusterCIDRs:          c.clusterCIDRs,
		NodePortAddresses:     c.nodePortAddresses,
		MasqueradeBit:         c.MasqueradeBit,
		HashSeed:              c.HashSeed,
		EndpointSelection:     c.EndpointSelection,
		Shards:                c.Shards.count(),
		ProxyPort:             c.ProxyProtocolPort,
		FlowtableDevices:      c.flowtableDevices(),
		FlowtablePackets:      c.flowtablePackets(),
		MasqueradeAddresses:   c.masqueradeAddrs,
		KeepClientAddress:     c.KeepClientAddress,
		ReleaseTimeWait:       c.ReleaseTimeWait,
		AnswerRefusedSYNs:     c.AnswerRefusedSYNs,
		MasqueradePortGroups:  c.masqueradePortGroups(),
		Counters:              c.Counters,
		DropMidstreamTCP:      c.dropMidstreamTCP(),
		MidstreamWait:         c.midstreamWait(),
		MidstreamWaitPeerDead: c.midstreamWaitPeerDead(),
		PeerMasquerade:        c.peerPools(),
		Unserved:              c.unserved(),
		ServiceEchoOff:        !c.AnswerServiceAddressPing,
		EchoRate:              uint32(c.ServicePingRate),
		EchoSourceRate:        uint32(c.ServicePingSourceRate),
		UntranslatedEventsOff: c.untranslatedEventsOff(),
		LeanServiceEvents:     c.leanServiceEvents(),
		TrafficElements:       uint32(c.CountersTrafficElements),
	}
}

// exposure decides which externalIPs and LoadBalancer IPs are served,
// given the gateway's own addresses.
func (c *Config) exposure(host []netip.Prefix) *model.Exposure {
	return &model.Exposure{ExternalIPCIDRs: c.externalIPCIDRs, Host: host}
}

// source picks where Services come from: an explicit manifests directory or
// kubeconfig, else $KUBECONFIG or the in-cluster account, else the default
// manifests directory.
//
// The directory or file is checked here, before anything touches the
// kernel or logs that the gateway is starting.
func (c *Config) source(log *slog.Logger) (source.Source, error) {
	if c.Manifests != "" {
		if err := checkManifestsDir("manifests", c.Manifests); err != nil {
			return nil, err
		}
		return &source.ManifestSource{Dir: c.Manifests, Log: log, MaxFileSize: int64(c.ManifestMaxFileSize)}, nil
	}
	if c.Kubeconfig != "" {
		if st, err := os.Stat(c.Kubeconfig); err != nil {
			return nil, fmt.Errorf("kubeconfig: %w", err)
		} else if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("kubeconfig: %s is not a file", c.Kubeconfig)
		}
	}
	rc, ok, err := source.LoadKubeConfig(c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	if ok {
		return &source.KubeSource{Config: rc, Log: log}, nil
	}
	if err := checkManifestsDir("manifests (no kubeconfig given or found, nor an in-cluster account)", DefaultManifests); err != nil {
		return nil, err
	}
	return &source.ManifestSource{Dir: DefaultManifests, Log: log, MaxFileSize: int64(c.ManifestMaxFileSize)}, nil
}

// checkManifestsDir tells whether dir is a readable directory.
func checkManifestsDir(key, dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("%s: %s is not a directory", key, dir)
	}
	if _, err := os.ReadDir(dir); err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	return nil
}

func serve(ctx context.Context, cfg *Config) error {
	log, err := appliance.NewLogger(cfg.LogLevel, cfg.LogFormat, os.Stderr)
	if err != nil {
		return err
	}
	// The page's timeline: events as they are logged, and the syncs.
	events := appliance.NewEvents(cfg.TimelineEvents)
	log = slog.New(appliance.NewEventHandler(log.Handler(), events, eventMessages))
	src, err := cfg.source(log)
	if err != nil {
		return err
	}
	var auth *appliance.BasicAuth
	if cfg.AuthUser != "" {
		if auth, err = appliance.BasicAuthFromFile(cfg.AuthUser, cfg.AuthPasswordFile); err != nil {
			return fmt.Errorf("auth_password_file: %w", err)
		}
	}
	memLimit := memlimit.New(int64(cfg.MemoryLimit), log)
	// Listen before touching the kernel: a port in use is a configuration
	// error, reported before anything changes.
	var ln net.Listener
	if cfg.Listen != "" {
		tlsConfig, err := cfg.tlsConfig(log)
		if err != nil {
			return err
		}
		if ln, err = net.Listen("tcp", cfg.Listen); err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		defer ln.Close()
		if tlsConfig != nil {
			ln = tls.NewListener(ln, tlsConfig)
		}
	}
	if ks, ok := src.(*source.KubeSource); ok && cfg.Zone == "" {
		zctx, zcancel := context.WithTimeout(ctx, 5*time.Second)
		zone, err := ks.NodeZone(zctx, cfg.NodeName)
		zcancel()
		switch {
		case err != nil:
			log.Info("no zone configured and the Node's zone label is not readable; topology hints by zone are off", "node", cfg.NodeName, "err", err)
		case zone != "":
			cfg.Zone = zone
			log.Info("zone from the Node's label", "node", cfg.NodeName, "zone", zone)
		}
	}
	// A kernel without a feature the ruleset uses fails here, naming it,
	// not at the first sync with a bare netlink error.
	rcfg := cfg.ruleset()
	if err := nft.CheckKernel(&rcfg); err != nil {
		return err
	}
	if err := setupReleaseTimeWait(cfg, log, timeWaitChecks{release: nft.CheckReleaseTimeWait, answer: nft.CheckAnswerRefusedSYNs}, conntrackTimeWaitSysctl); err != nil {
		return err
	}
	chooseConntrackEvents(cfg, log, leanChecks{lean: nft.CheckLeanEvents,
		timeWait: func() (int, error) { return readIntFile(conntrackTimeWaitSysctl) },
		finWait:  func() (int, error) { return readIntFile(conntrackFinWaitSysctl) }})
	setupConntrackMax(cfg, log, cpuCount(onlineCPUsFile), conntrackMaxSysctl, conntrackBucketsSysctl)
	if err := setupConntrackAcct(cfg, log, conntrackAcctSysctl); err != nil {
		return err
	}
	if err := cfg.checkFlowtableDevices(); err != nil {
		return err
	}
	if g := rcfg.MasqueradePortGroups; g > 1 {
		p := ruleset.GroupPorts(0, g)
		log.Info("TCP masquerade ports by CPU", "groups", g, "ports_per_group", int(p.Max-p.Min)+1)
	}
	prog, err := nft.NewProgrammer(cfg.ruleset(), nft.Options{Streamed: memLimit.Streamed, ChooseShards: cfg.Shards.chooseShards()})
	if err != nil {
		var fe *nft.ForeignTableError
		if errors.As(err, &fe) {
			return fmt.Errorf("table = %q: %w", cfg.Table, err)
		}
		return err
	}
	defer prog.Close()
	// The gateway's own addresses are never served for a Service: they
	// are followed as they change.
	host, err := hostaddr.List(0)
	if err != nil {
		return fmt.Errorf("list the gateway's addresses: %w", err)
	}

	started := time.Now()
	metrics := appliance.NewMetrics(version)
	rec := appliance.NewRecorder(appliance.Identity{
		NodeName: cfg.NodeName, Version: version, StartTime: time.Now(),
		Kernel: kernelRelease(), Table: cfg.Table, Source: src.Describe(),
	}, metrics, 0)
	notifier, err := notify.New(log)
	if err != nil {
		return err
	}

	// The edge: announcers first (nothing is announced before the first
	// sync), then address allocation wired into the source.
	edge, err := startEdge(cfg, prog.SetMidstreamElements, metrics.Registry(), log)
	if err != nil {
		return err
	}
	drain := newDrainer(edge.coord, time.Duration(cfg.DrainPeriod), log)
	edge.handOver(drain, cfg)
	defer func() { edge.close(cfg.DrainOnStop || drain.DrainState().State != appliance.DrainServing) }()
	if err := edge.routePods(cfg, src, metrics.Registry(), log); err != nil {
		return err
	}
	pp, err := startProxy(cfg, metrics.Registry(), log)
	if err != nil {
		return err
	}
	tracker := loop.NewTracker()
	sink, err := edge.allocate(cfg, src, tracker, metrics.Registry(), log)
	if err != nil {
		return err
	}
	syncer := &loop.Syncer{
		Tracker:     tracker,
		Programmer:  prog,
		Options:     cfg.modelOptions(),
		Exposure:    cfg.exposure(host),
		Log:         log,
		MinInterval: time.Duration(cfg.MinSyncInterval),
		Reconcile:   time.Duration(cfg.ReconcileInterval),

		MinRepairInterval: time.Duration(cfg.MinRepairInterval),
	}
	syncer.BeforeFull = memLimit.BeforeFull
	syncer.Observers = append(syncer.Observers, edge.observe, syncEvent(events))
	pub := status.NewPublisher(syncer, rec, cfg.ruleset().Node, log)
	syncer.Touched = pub.Touch
	pub.Rebuilt = memLimit.Collect
	syncer.Observers = append(syncer.Observers, func(ev loop.Event) {
		kind := appliance.SyncPartial
		if ev.Full {
			kind = appliance.SyncFull
		}
		t := prog.Totals()
		r := appliance.SyncResult{Kind: kind, Duration: ev.Result.Duration, Messages: ev.Result.Messages, Err: ev.Err,
			KernelMatches: ev.Err == nil, Chains: t.Chains, Rules: t.Rules, MapElements: t.Elements}
		if ev.Err == nil {
			// Network programming latency, as kube-proxy measures it:
			// from the change in the cluster to the batch committed. As
			// there, changes older than this process are not counted: the
			// first sync would report the age of the cluster.
			now := time.Now()
			for _, tr := range ev.Triggers {
				if tr.After(started) {
					r.ProgrammingLatencies = append(r.ProgrammingLatencies, now.Sub(tr))
				}
			}
		}
		rec.RecordSync(r)
		// A full sync that read nothing back (nobody else committed a
		// transaction since) held no more memory than a partial one.
		memLimit.Synced(ev.Full && (ev.Result.ReadBack || ev.Result.Messages > 0))
		if ev.Err == nil && ev.Full {
			for _, d := range ev.Result.Drift {
				metrics.DriftRepaired(driftReason(d))
			}
			_ = notifier.Ready(fmt.Sprintf("serving %d services", syncer.Programmed()))
		}
		if ev.Changed > 0 {
			metrics.ServiceChanged(ev.Changed)
		}
	})

	// Every goroutine serve starts is in wg, and ends before serve
	// returns: cancel first, then wait (deferred calls run in reverse).
	var wg sync.WaitGroup
	defer wg.Wait()
	// A signal ends serve through stop; what serve starts runs on ctx,
	// which outlives it while a drain (drain_on_stop) is under way.
	stop := ctx
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	wg.Go(func() { drain.run(ctx) })
	// The live data that follows connections (state sync's flows, the
	// traffic view) keeps the memory limit above it between syncs.
	wg.Go(func() { memLimit.Follow(ctx, memlimit.FollowInterval) })

	// Stale conntrack cleanup: after each sync, on its own goroutine.
	if ct, err := conntrack.New(); err != nil {
		log.Error("conntrack cleaner unavailable: running WITHOUT stale UDP/SCTP flow cleanup", "err", err)
	} else {
		cleaner := &conntrack.Runner{Cleaner: ct, Ruleset: cfg.ruleset(), Log: log,
			Report: func(r conntrack.Report) { rec.RecordConntrack(r.Result.Deleted, r.Result.Duration, r.Err) }}
		syncer.Observers = append(syncer.Observers, cleaner.Observe)
		ctDone := make(chan struct{})
		wg.Go(func() { cleaner.Run(ctx); close(ctDone) })
		defer func() { cancel(); <-ctDone; ct.Close() }()
	}

	runProxy(ctx, pp, syncer, &wg)

	// Health check node ports of Services with externalTrafficPolicy
	// Local: fed by each sync, opened and closed on their own goroutine.
	hc := &healthcheck.Server{NodeName: cfg.NodeName, Log: log, Healthy: func() bool {
		ok, _ := appliance.Health(rec.Snapshot(), time.Now(), time.Duration(cfg.HealthzMaxAge))
		return ok
	}}
	syncer.Observers = append(syncer.Observers, func(ev loop.Event) {
		if ev.Err == nil {
			hc.Update(ev.After)
		}
	})
	wg.Go(func() { hc.Run(ctx) })

	wg.Go(func() {
		hostaddr.Watch(ctx, 0, host, func(h []netip.Prefix) {
			log.Info("the gateway's addresses changed", "addresses", h)
			syncer.SetExposure(cfg.exposure(h))
		}, log)
	})

	errc := make(chan error, 5)
	edge.statesync.run(ctx, syncer, &wg, errc)
	wg.Go(func() { errc <- src.Run(ctx, sink) })
	wg.Go(func() {
		if err := edge.run(ctx); err != nil {
			errc <- err
		}
	})
	wg.Go(func() { errc <- syncer.Run(ctx) })
	wg.Go(func() { watchDrift(ctx, prog, syncer, metrics.Registry(), log) })
	wg.Go(func() { pub.Run(ctx) })
	wg.Go(func() { status.FollowSource(ctx, src, rec, time.Second) })
	// The watchdog asks whether the sync loop is alive, not whether the
	// gateway is healthy: a restart cures a stuck loop, but not a lost API
	// or a refused batch, and would only add a restart to the trouble.
	watchdog := func() error {
		reconcile := time.Duration(cfg.ReconcileInterval)
		last := rec.Snapshot().Sync.LastAttempt
		if reconcile > 0 && syncer.FirstSyncDone() && time.Since(last) > 3*reconcile+time.Minute {
			return fmt.Errorf("no sync attempted for %s", time.Since(last).Round(time.Second))
		}
		return nil
	}
	wg.Go(func() { notifier.Watchdog(ctx, watchdog) })
	var srv *http.Server
	// The counters and flows: the API always, Prometheus their totals
	// (and per Service port with metrics_per_service).
	tr := newTraffic(prog)
	metrics.Registry().MustRegister(appliance.NewTrafficCollector(tr, cfg.MetricsPerService))
	if cfg.Counters && (cfg.ReleaseTimeWait || cfg.AnswerRefusedSYNs) {
		metrics.Registry().MustRegister(appliance.NewResetsCollector(tr.resets(cfg.ReleaseTimeWait, cfg.AnswerRefusedSYNs)))
	}
	if cfg.Counters && cfg.midstreamWait() > 0 {
		metrics.Registry().MustRegister(appliance.NewMidstreamCollector(tr.midstream))
	}
	if rcfg := cfg.ruleset(); cfg.Counters && ruleset.HasMidstreamHomes(&rcfg) {
		metrics.Registry().MustRegister(appliance.NewStrayRepliesCollector(tr.strayReplies))
	}
	hist := cfg.history()
	if hist != nil {
		wg.Go(func() { hist.Run(ctx, tr, log) })
	}
	if ln != nil {
		srv = httpserver.New(appliance.NewServer(appliance.Options{Source: pub, Metrics: metrics,
			MaxSyncAge: time.Duration(cfg.HealthzMaxAge), Auth: auth, Logger: log,
			AllowedHosts: cfg.allowedHosts(), Pprof: cfg.Pprof, Edge: edge.view, Drain: drain, Gateways: edge.gatewaysAPI(), StateSync: edge.stateSyncAPI(), Traffic: tr,
			History: hist, Events: events}), httpserver.Default)
		wg.Go(func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("http: %w", err)
			}
		})
	}
	log.Info("nftgate started", "version", version, "node", cfg.NodeName, "table", cfg.Table, "source", src.Describe(), "listen", cfg.Listen)

	var runErr error
	select {
	case <-stop.Done():
		if cfg.DrainOnStop {
			runErr = drainOnStop(drain, errc)
		}
	case <-drain.Done(): // nftgate drain
	case runErr = <-errc:
	}
	_ = notifier.Stopping()
	cancel()
	if srv != nil {
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = srv.Shutdown(sctx)
		scancel()
	}
	// The rules stay in the kernel: traffic keeps flowing while nftgate
	// restarts or is updated.
	log.Info("nftgate stopped; the rules stay in place", "table", cfg.Table)
	return runErr
}

func driftReason(d string) string {
	switch {
	case strings.Contains(d, "table is missing"):
		return appliance.DriftTable
	case strings.Contains(d, "missing"):
		return appliance.DriftMissing
	case strings.Contains(d, "unknown"):
		return appliance.DriftUnexpected
	}
	return appliance.DriftModified
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

func cleanup(cfg *Config) error {
	if err := nft.Cleanup(cfg.Table, nft.Options{}); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	// The routes to pods, whatever pod_routes says now.
	if _, err := podroutes.Cleanup(nil); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	return nil
}

// render prints the ruleset the gateway would program for its source, as
// an nft script, without touching the kernel. It reads manifests only.
func render(ctx context.Context, cfg *Config, w io.Writer) error {
	dir := cfg.Manifests
	if dir == "" {
		dir = DefaultManifests
	}
	tracker := loop.NewTracker()
	files, err := source.ManifestFiles(dir)
	if err != nil {
		return fmt.Errorf("manifests: %w", err)
	}
	// LoadBalancer addresses are allocated from the pools as serve would.
	var sink source.Sink = tracker
	if len(cfg.ipamPolicy.Pools) > 0 {
		mem, err := ipam.NewMemory(cfg.ipamPolicy, tracker, nil, nil)
		if err != nil {
			return err
		}
		sink = mem
	}
	for _, f := range files {
		objs, err := source.ReadManifestFile(f, int64(cfg.ManifestMaxFileSize))
		if err != nil {
			return err
		}
		source.Feed(sink, objs)
	}
	sink.SetSynced()
	rc := cfg.ruleset()
	all, _ := tracker.All()
	keys := make([]model.ServiceKey, 0, len(all))
	for k := range all {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].Less(keys[j]) })
	opts := cfg.modelOptions()
	// The addresses of the machine it runs on stand for the gateway's.
	host, err := hostaddr.List(0)
	if err != nil {
		return fmt.Errorf("list this machine's addresses: %w", err)
	}
	exposure := cfg.exposure(host)
	var svcs []*model.Service
	for _, k := range keys {
		o := all[k]
		if o.Service == nil || o.Service.Skip(opts) != "" {
			continue
		}
		m, err := model.Build(o.Service, o.Slices, opts)
		if err != nil {
			fmt.Fprintln(os.Stderr, "nftgate: skipping:", err)
			continue
		}
		m, refused := exposure.Apply(m)
		for _, w := range refused {
			fmt.Fprintf(os.Stderr, "nftgate: service %s: %s\n", k, w)
		}
		svcs = append(svcs, m)
	}
	if choose := cfg.Shards.chooseShards(); choose != nil {
		rc.Shards = choose(len(svcs), 0)
	}
	for i, f := range ruleset.Families {
		if i > 0 {
			fmt.Fprintln(w)
		}
		if err := ruleset.WriteTables(w, f, ruleset.Layout(&rc, f, svcs)); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// allowedHosts are the host names the status server answers to without
// authentication: http_allowed_hosts and the listen address's host.
func (c *Config) allowedHosts() []string {
	hosts := slices.Clone(c.HTTPAllowedHosts)
	if host, _, err := net.SplitHostPort(c.Listen); err == nil && host != "" {
		hosts = append(hosts, host)
	}
	return hosts
}

// tlsConfig loads the status server's certificate: tls_cert_file and
// tls_key_file, or the one kept in tls_self_signed_dir (made on first
// start). Nil means plain HTTP.
func (c *Config) tlsConfig(log *slog.Logger) (*tls.Config, error) {
	switch {
	case c.TLSCertFile != "":
		cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls_cert_file %q, tls_key_file %q: %w", c.TLSCertFile, c.TLSKeyFile, err)
		}
		return appliance.TLSConfig(cert), nil
	case c.TLSSelfSignedDir != "":
		cert, created, err := appliance.SelfSignedCertificate(c.TLSSelfSignedDir, c.certificateNames(), time.Now())
		if err != nil {
			return nil, fmt.Errorf("tls_self_signed_dir: %w", err)
		}
		if created {
			log.Info("self-signed certificate created for the status server", "dir", c.TLSSelfSignedDir,
				"sha256", appliance.CertificateSHA256(cert))
		}
		return appliance.TLSConfig(cert), nil
	}
	return nil, nil
}

// certificateNames are the names a self-signed certificate is made for:
// the host and node names, localhost, loopback and the listen address.
func (c *Config) certificateNames() []string {
	names := []string{c.NodeName}
	if h, err := os.Hostname(); err == nil {
		names = append(names, h)
	}
	names = append(names, "localhost", "127.0.0.1", "::1")
	if host, _, err := net.SplitHostPort(c.Listen); err == nil {
		if a, err := netip.ParseAddr(host); err == nil && !a.IsUnspecified() {
			names = append(names, a.String())
		}
	}
	return names
}
