package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Sources of the Services: the API, or a directory of manifest files that
// only nftgate reads (--manifests). Loading 100,000 Services through
// kube-apiserver costs it time quadratic in their number (see "Large
// sizes" in bench/README.md); files cost nothing of the sort.
const (
	sourceAPI       = "api"
	sourceManifests = "manifests"
)

var allSources = []string{sourceAPI, sourceManifests}

// The manifest files. The canary and the changed Service have files of
// their own, so an endpoint change rewrites a file of two objects and
// nftgate's reading of it does not scale with the bulk.
const (
	canaryFile = "canary.json"
	changeFile = "change.json"
	bulkFile   = "bulk-%06d.json" // bulk Services [k×per file, (k+1)×per file)
)

// ManifestDir is a directory of manifest files for nftgate --manifests.
type ManifestDir struct {
	Dir string
	// PerFile is how many bulk Services, each with its EndpointSlice, one
	// file holds.
	PerFile int
}

// Write replaces the file name in the directory with objs as JSON
// documents separated by "---" lines. It writes a hidden file beside it
// and renames that over it, as deployment tooling does, so nftgate reads
// either the old content or the new, never half of it. It returns the
// time just before the rename: from then on the new content is there.
func (m *ManifestDir) Write(name string, objs ...any) (time.Time, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for i, o := range objs {
		if i > 0 {
			b.WriteString("---\n")
		}
		if err := enc.Encode(o); err != nil {
			return time.Time{}, fmt.Errorf("manifest %s: object %d: %w", name, i+1, err)
		}
	}
	path := filepath.Join(m.Dir, name)
	// The leading dot keeps nftgate from reading the file half written.
	tmp := filepath.Join(m.Dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
		return time.Time{}, fmt.Errorf("manifest %s: %w", name, err)
	}
	at := time.Now()
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return at, fmt.Errorf("manifest %s: %w", name, err)
	}
	return at, nil
}

// writeFixed writes the canary's and the changed Service's files: the
// objects Setup creates in the API, endpoints on the echo servers.
func (e *Env) writeFixed() error {
	backends := e.Topo.BackendIPv4[:e.Cfg.Endpoints]
	if _, err := e.Manifests.Write(canaryFile, service(canaryName, canaryIP), slice(canaryName, canaryPort, backends)); err != nil {
		return err
	}
	_, err := e.Manifests.Write(changeFile, service(changeName, changeIP), slice(changeName, changePortA, backends))
	return err
}

// writeBulk writes bulk Services until there are target of them, the
// objects LoadTo creates in the API, PerFile to a file. A file the last
// size left partly filled is written again whole.
func (e *Env) writeBulk(ctx context.Context, target int) (time.Duration, error) {
	start := time.Now()
	per := e.Manifests.PerFile
	for first := e.bulk / per * per; first < target; first += per {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		last := min(first+per, target)
		objs := make([]any, 0, 2*(last-first))
		for i := first; i < last; i++ {
			svc, sl, err := e.bulkObjects(i)
			if err != nil {
				return 0, err
			}
			objs = append(objs, svc, sl)
		}
		if _, err := e.Manifests.Write(fmt.Sprintf(bulkFile, first/per), objs...); err != nil {
			return 0, err
		}
	}
	for _, i := range []int{0, target / 2, target - 1} {
		ip, err := bulkIP(i)
		if err != nil {
			return 0, err
		}
		e.probeIPs[i] = ip
	}
	e.bulk = target
	return time.Since(start), nil
}
