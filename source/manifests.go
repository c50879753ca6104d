package source

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	goruntime "runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/nftgate/nftgate/model"
)

// Sink receives what a source reads: loop.Tracker in production.
type Sink interface {
	SetServiceObject(*model.ServiceObject)
	DeleteService(model.ServiceKey)
	SetSliceObject(*model.SliceObject)
	DeleteSlice(namespace, name string)
	// SetSynced records that the source's first complete view is in.
	SetSynced()
}

// ServiceStage is a Sink that takes Services in their API form and passes
// them on to the model itself: LoadBalancer address allocation without a
// cluster, which fills status.loadBalancer.ingress first. A ManifestSource
// (and Feed) given a ServiceStage calls SetService instead of
// SetServiceObject; file names the manifest, for the model's errors.
type ServiceStage interface {
	Sink
	SetService(svc *corev1.Service, file string)
}

// stagedService is a Service kept in its API form for a ServiceStage.
type stagedService struct {
	svc  *corev1.Service
	file string
}

// Source delivers Service and EndpointSlice objects into a Sink until its
// context ends. It calls Sink.SetSynced once its first complete view is
// in.
type Source interface {
	Run(ctx context.Context, t Sink) error
	// Describe names the source for logs and the status page.
	Describe() string
	// Problems lists what the source could not read, right now.
	Problems() []string
}

// How long the manifests source waits for a file being written: see Run.
const (
	settleQuiet = 20 * time.Millisecond
	settleMax   = time.Second
)

// ManifestSource reads Service and EndpointSlice manifests (YAML or JSON,
// several documents per file, or a List, as `kubectl apply -f` takes them)
// from a directory, and follows changes to it.
type ManifestSource struct {
	Dir string
	Log *slog.Logger
	// Rescan is a safety net for missed file events; zero means 30 s.
	Rescan time.Duration
	// MaxFileSize is the largest manifest file read, in bytes; zero means
	// DefaultMaxFileSize. A larger file is refused before it is read.
	MaxFileSize int64

	mu       sync.Mutex
	problems map[string]string // file -> why it is not applied
	// lastGood keeps each file's objects from its last good read, as
	// *model.ServiceObject and *model.SliceObject: a file that becomes
	// malformed keeps its previous content in effect.
	lastGood map[string][]any
	// read is each file's content hash and error at its last read: an
	// unchanged file is not decoded again on every rescan.
	read map[string]fileRead
	// files are the manifest files of the last full scan, in name order.
	files []string
	// merged is each file's objects as the tracker last heard of them,
	// and mergedFiles the files in effect then, in name order: what is in
	// effect is worked out from them when it changes, not kept in an
	// index of every object (at a hundred thousand Services an index by
	// name cost 40 MB for as many objects as the tracker holds already).
	// The lists are lastGood's own, shared.
	merged      map[string][]any
	mergedFiles []string
	// shadowed names the file whose object is in effect for each object
	// defined more than once (the later file wins); mostly empty.
	shadowed map[objectKey]string
	// staged: the sink is a ServiceStage, Services are kept in API form.
	staged bool
	// unmerged is set when lastGood changed since the last merge.
	unmerged bool
	// reads counts the files read, for tests.
	reads int
	// settleQuiet and settleMax replace the consts of those names when
	// set (tests).
	settleQuiet, settleMax time.Duration
}

type fileRead struct {
	sum [sha256.Size]byte
	err error
	// stamp is the file's stamp taken before that read.
	stamp fileStamp
}

// fileStamp identifies a file's content without reading it: its inode,
// size, and modification and change times (nanoseconds), and those of
// the file a symlink names. A write, a rename over it or a retargeted
// symlink changes it.
type fileStamp struct {
	link, target stampOf
}

type stampOf struct {
	dev, ino, size uint64
	mtime, ctime   int64
	mode           fs.FileMode
}

// stampFile returns path's stamp; ok is false when it cannot be taken.
func stampFile(path string) (s fileStamp, ok bool) {
	of := func(st fs.FileInfo) (stampOf, bool) {
		sys, ok := st.Sys().(*syscall.Stat_t)
		if !ok {
			return stampOf{}, false
		}
		return stampOf{dev: uint64(sys.Dev), ino: sys.Ino, size: uint64(sys.Size),
			mtime: sys.Mtim.Nano(), ctime: sys.Ctim.Nano(), mode: st.Mode()}, true
	}
	lst, err := os.Lstat(path)
	if err != nil {
		return s, false
	}
	if s.link, ok = of(lst); !ok {
		return s, false
	}
	if lst.Mode()&fs.ModeSymlink != 0 {
		st, err := os.Stat(path)
		if err != nil {
			return s, false
		}
		if s.target, ok = of(st); !ok {
			return s, false
		}
	}
	return s, true
}

type objectKey struct {
	kind, namespace, name string
}

// Describe implements Source.
func (m *ManifestSource) Describe() string { return "manifests:" + m.Dir }

// Problems implements Source.
func (m *ManifestSource) Problems() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, p := range m.problems {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// Run implements Source.
func (m *ManifestSource) Run(ctx context.Context, t Sink) error {
	log := m.Log
	if log == nil {
		log = slog.Default()
	}
	m.mu.Lock()
	_, m.staged = t.(ServiceStage)
	m.mu.Unlock()
	if st, err := os.Stat(m.Dir); err != nil {
		return fmt.Errorf("manifests directory: %w", err)
	} else if !st.IsDir() {
		return fmt.Errorf("manifests directory: %s is not a directory", m.Dir)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch manifests directory: %w", err)
	}
	defer w.Close()
	if err := w.Add(m.Dir); err != nil {
		return fmt.Errorf("watch manifests directory %s: %w", m.Dir, err)
	}
	m.scan(t, log)
	t.SetSynced()

	rescan := m.Rescan
	if rescan == 0 {
		rescan = 30 * time.Second
	}
	ticker := time.NewTicker(rescan)
	defer ticker.Stop()
	// Editors and tools write files in several steps: the files named by
	// events are read once no event has come for settleQuiet (a large file
	// written in many steps is not read half way), or settleMax after the
	// first (a directory that never stops changing is still followed).
	// Only the files named are read: at ten thousand Services reading and
	// hashing every file took longer than the sync.
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	defer settle.Stop()
	var first time.Time
	changed := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("manifests watcher closed")
			}
			if ev.Has(fsnotify.Chmod) && !ev.Has(fsnotify.Write) {
				continue
			}
			if ev.Op == fsnotify.Create && !changed[ev.Name] && m.known(ev.Name) {
				// A file created where a manifest is, with no removal
				// before it, was renamed over it: its content is whole
				// (the way tools replace a file at once), so it is read
				// now rather than after the settling wait.
				m.scanFiles(t, log, map[string]bool{ev.Name: true})
				continue
			}
			changed[ev.Name] = true
			if first.IsZero() {
				first = time.Now()
			}
			quiet, most := settleQuiet, settleMax
			if m.settleQuiet > 0 {
				quiet, most = m.settleQuiet, m.settleMax
			}
			settle.Reset(min(quiet, max(0, most-time.Since(first))))
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("manifests watcher closed")
			}
			log.Warn("manifests watcher", "err", err)
		case <-settle.C:
			m.scanFiles(t, log, changed)
			changed, first = map[string]bool{}, time.Time{}
		case <-ticker.C:
			m.scan(t, log)
		}
	}
}

// known tells whether path is a manifest file of the last full scan.
func (m *ManifestSource) known(path string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.knownLocked(path)
}

func (m *ManifestSource) knownLocked(path string) bool {
	_, read := m.read[path]
	_, listed := slices.BinarySearch(m.files, path) // in name order
	return read && listed
}

// scan reads the directory and tells the tracker what changed.
func (m *ManifestSource) scan(t Sink, log *slog.Logger) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lastGood == nil {
		m.lastGood = map[string][]any{}
		m.read = map[string]fileRead{}
	}
	files, err := ManifestFiles(m.Dir)
	if err != nil {
		log.Warn("manifests directory unreadable, keeping what is programmed", "dir", m.Dir, "err", err)
		m.problems = map[string]string{m.Dir: err.Error()}
		return
	}
	problems := map[string]string{}
	present := map[string]bool{}
	changed := !slices.Equal(files, m.files)
	// A file whose stamp is as at its last read is not read again:
	// reading and hashing every file of a hundred thousand Services at
	// each rescan cost a CPU second.
	type toRead struct {
		path    string
		stamp   fileStamp
		stamped bool
		got     fileDecode
	}
	var todo []toRead
	for _, f := range files {
		present[f] = true
		stamp, stamped := stampFile(f)
		if prev, ok := m.read[f]; ok && stamped && prev.stamp == stamp {
			if prev.err != nil {
				problems[f] = prev.err.Error()
			}
			continue
		}
		todo = append(todo, toRead{path: f, stamp: stamp, stamped: stamped})
	}
	// The files are read and decoded on every CPU (decoding is most of
	// a cold start's time before the first sync), and what they hold is
	// taken in file order as before.
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(goruntime.GOMAXPROCS(0), len(todo)) {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(todo); i = int(next.Add(1)) - 1 {
				todo[i].got = m.decodeFile(todo[i].path)
			}
		})
	}
	wg.Wait()
	for i := range todo {
		f, stamp, stamped := todo[i].path, todo[i].stamp, todo[i].stamped
		objs, err := m.readDecoded(f, todo[i].got)
		todo[i].got = fileDecode{}
		if r, ok := m.read[f]; ok && stamped {
			r.stamp = stamp
			m.read[f] = r
		}
		if err != nil {
			problems[f] = err.Error()
			if m.problems[f] != err.Error() {
				log.Warn("manifest not applied; its previous content stays in effect", "file", f, "err", err)
			}
			continue
		}
		if objs != nil {
			m.lastGood[f] = objs
			changed = true
		}
	}
	for f := range m.lastGood {
		if !present[f] {
			delete(m.lastGood, f)
			changed = true
		}
	}
	for f := range m.read {
		if !present[f] {
			delete(m.read, f)
		}
	}
	m.problems = problems
	m.files = files
	if changed || m.unmerged {
		m.mergeLocked(t, log)
	}
}

// mergeLocked works out which objects are in effect from every file's last
// good objects, and tells the tracker what changed since the last merge.
func (m *ManifestSource) mergeLocked(t Sink, log *slog.Logger) {
	prev, _ := effective(m.mergedFiles, m.merged, nil)
	next, shadowed := effective(m.files, m.lastGood, log)
	for k, o := range next {
		if old, ok := prev[k]; ok && reflect.DeepEqual(old, o) {
			continue
		}
		setObject(t, o)
	}
	for k := range prev {
		if _, ok := next[k]; ok {
			continue
		}
		switch k.kind {
		case "Service":
			t.DeleteService(model.NewServiceKey(k.namespace, k.name))
		case "EndpointSlice":
			t.DeleteSlice(k.namespace, k.name)
		}
	}
	m.merged = maps.Clone(m.lastGood)
	m.mergedFiles = m.files
	m.shadowed = shadowed
	m.unmerged = false
}

// effective returns the objects in effect from the objects of files, in
// order (a later file wins an object defined twice), and for each object
// defined more than once, the file whose object wins. A non-nil log is
// told of each object defined twice.
func effective(files []string, objs map[string][]any, log *slog.Logger) (map[objectKey]any, map[objectKey]string) {
	n := 0
	for _, f := range files {
		n += len(objs[f])
	}
	out := make(map[objectKey]any, n)
	var from map[objectKey]string // the file of each object, once one is defined twice
	var shadowed map[objectKey]string
	for fi, f := range files {
		for oi, o := range objs[f] {
			k := keyOf(o)
			if _, dup := out[k]; dup {
				if from == nil {
					// Rare: find the file of every object so far.
					from = make(map[objectKey]string, n)
					for _, g := range files[:fi] {
						for _, p := range objs[g] {
							from[keyOf(p)] = g
						}
					}
					for _, p := range objs[f][:oi] {
						from[keyOf(p)] = f
					}
				}
				if log != nil {
					log.Warn("object defined twice; the later file wins", "object", k.kind+" "+k.namespace+"/"+k.name, "first", from[k], "second", f)
				}
				if shadowed == nil {
					shadowed = map[objectKey]string{}
				}
				shadowed[k] = f
			}
			out[k] = o
			if from != nil {
				from[k] = f
			}
		}
	}
	return out, shadowed
}

// scanFiles reads the files events named, and tells the tracker what
// changed. Files whose objects keep their names, none of them defined
// twice, only replace those objects; anything else (a new or removed file,
// an object added to or removed from a file) takes a full scan.
func (m *ManifestSource) scanFiles(t Sink, log *slog.Logger, paths map[string]bool) {
	m.mu.Lock()
	if m.lastGood == nil {
		m.mu.Unlock()
		m.scan(t, log)
		return
	}
	full := false
	unmerged := m.unmerged
	var replace []string
	for p := range paths {
		if !manifestName(filepath.Base(p)) {
			continue // a temporary file, say, before it is renamed into place
		}
		if !m.knownLocked(p) {
			full = true // a new file, or one the last full scan skipped
			continue
		}
		objs, err := m.readChanged(p)
		if err != nil {
			if os.IsNotExist(err) {
				full = true // removed or renamed away
				continue
			}
			if m.problems[p] != err.Error() {
				log.Warn("manifest not applied; its previous content stays in effect", "file", p, "err", err)
			}
			m.problems[p] = err.Error()
			continue
		}
		delete(m.problems, p)
		if objs == nil {
			continue // the same content
		}
		if !sameKeys(m.merged[p], objs) || slices.ContainsFunc(objs, func(o any) bool { _, dup := m.shadowed[keyOf(o)]; return dup }) {
			full = true
		}
		m.lastGood[p] = objs
		m.unmerged = true
		replace = append(replace, p)
	}
	if full {
		m.mu.Unlock()
		m.scan(t, log)
		return
	}
	defer m.mu.Unlock()
	for _, p := range replace {
		old := m.merged[p]
		for i, o := range m.lastGood[p] {
			if !reflect.DeepEqual(old[i], o) {
				setObject(t, o)
			}
		}
		m.merged[p] = m.lastGood[p]
	}
	m.unmerged = unmerged // merged follows the files replaced
}

// sameKeys tells whether two lists of objects name the same objects in the
// same order.
func sameKeys(a, b []any) bool {
	return slices.EqualFunc(a, b, func(x, y any) bool { return keyOf(x) == keyOf(y) })
}

// setObject records a converted object in the tracker.
func setObject(t Sink, o any) {
	switch obj := o.(type) {
	case *model.ServiceObject:
		t.SetServiceObject(obj)
	case *model.SliceObject:
		t.SetSliceObject(obj)
	case *stagedService:
		t.(ServiceStage).SetService(obj.svc, obj.file)
	}
}

// readChanged reads a file and decodes it if its content changed since the
// last read, converting the objects to what the model reads of them. objs
// is nil when the content is the same; err repeats the last error then.
func (m *ManifestSource) readChanged(path string) (objs []any, err error) {
	return m.readDecoded(path, m.decodeFile(path))
}

// fileDecode is what decodeFile found in a file.
type fileDecode struct {
	readErr error // the file could not be read
	sum     [sha256.Size]byte
	same    bool // the content is as at the last read: not decoded
	objs    []any
	err     error // the content is not valid
}

// decodeFile reads a file and, if its content changed since the last
// read, decodes it and converts its objects to what the model reads of
// them. It changes nothing in m: files are decoded concurrently, under
// m.mu held by their caller.
func (m *ManifestSource) decodeFile(path string) fileDecode {
	data, err := readManifestData(path, m.MaxFileSize)
	if err != nil {
		return fileDecode{readErr: err}
	}
	d := fileDecode{sum: sha256.Sum256(data)}
	if prev, ok := m.read[path]; ok && prev.sum == d.sum {
		d.same = true
		return d
	}
	decoded, err := decodeManifest(path, data)
	if err != nil {
		d.err = err
		return d
	}
	d.objs = make([]any, 0, len(decoded)) // a file without objects is still read
	for _, o := range decoded {
		switch obj := o.(type) {
		case *corev1.Service:
			if m.staged {
				d.objs = append(d.objs, &stagedService{obj, path})
				continue
			}
			d.objs = append(d.objs, model.NewServiceObject(obj).InFile(path))
		case *discoveryv1.EndpointSlice:
			d.objs = append(d.objs, model.NewSliceObject(obj).InFile(path))
		}
	}
	return d
}

// readDecoded records what decodeFile found in a file: objs is nil when
// the content is the same; err repeats the last error then.
func (m *ManifestSource) readDecoded(path string, d fileDecode) (objs []any, err error) {
	m.reads++
	if d.readErr != nil {
		delete(m.read, path)
		return nil, d.readErr
	}
	if d.same {
		return nil, m.read[path].err
	}
	m.read[path] = fileRead{sum: d.sum, err: d.err}
	if d.err != nil {
		return nil, d.err
	}
	return d.objs, nil
}

func keyOf(o any) objectKey {
	switch obj := o.(type) {
	case *model.ServiceObject:
		return objectKey{"Service", obj.Key.Namespace(), obj.Key.Name()}
	case *model.SliceObject:
		return objectKey{"EndpointSlice", obj.Namespace(), obj.Name}
	case *stagedService:
		ns := obj.svc.Namespace
		if ns == "" {
			ns = "default"
		}
		return objectKey{"Service", ns, obj.svc.Name}
	}
	return objectKey{}
}

// manifestName tells whether a file of this name may hold manifests.
func manifestName(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false // editor swap files, and ..data of mounted ConfigMaps
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// ManifestFiles lists the manifest files of a directory, in name order.
func ManifestFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		name := e.Name()
		if !manifestName(name) {
			continue
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err != nil || st.IsDir() {
			continue
		}
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}

// ReadManifestFile decodes every Service and EndpointSlice in a file of
// at most maxSize bytes (zero means DefaultMaxFileSize), read as
// readManifestData reads it. Objects of other kinds are skipped, as a
// directory of an application's manifests holds Deployments too. Any
// malformed document fails the whole file, with its name, the document's
// position and the reason.
func ReadManifestFile(path string, maxSize int64) ([]runtime.Object, error) {
	data, err := readManifestData(path, maxSize)
	if err != nil {
		return nil, err
	}
	return decodeManifest(path, data)
}

// DefaultMaxFileSize is the default limit of a manifest file's size
// (manifest_max_file_size in config.toml): a Service with its
// EndpointSlice is usually under 1 KiB of YAML, so a file at the limit
// holds tens of thousands, and reading and decoding one took about
// 100 MiB of resident memory (`nftgate render`), where a 200 MB file took
// 430 MiB and 52 s before it was refused.
const DefaultMaxFileSize = 32 << 20

// readManifestData reads a manifest file of the directory it is in. Only a
// regular file is read, directly or through symlinks that stay inside the
// directory (as in a mounted ConfigMap): a FIFO, a socket or a device
// (such as a link to /dev/zero) is refused by name without being opened,
// and the file is opened without blocking and checked again once open, in
// case it was replaced meanwhile. A file larger than maxSize bytes (zero
// means DefaultMaxFileSize) is refused before it is read, and the read
// stops past maxSize bytes, so no file costs more memory than that.
func readManifestData(path string, maxSize int64) ([]byte, error) {
	if maxSize <= 0 {
		maxSize = DefaultMaxFileSize
	}
	dir, name := filepath.Dir(path), filepath.Base(path)
	lst, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	st, via, rel := lst, "", name
	if lst.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(path)
		if err != nil {
			return nil, err
		}
		via = " (through the symlink to " + target + ")"
		if st, err = os.Stat(path); err != nil {
			return nil, err // a dangling symlink is no file, as a removed one
		}
		if st.Mode().IsRegular() {
			var inside bool
			if rel, inside, err = resolveInside(dir, path); err != nil {
				return nil, err
			} else if !inside {
				return nil, fmt.Errorf("%s: symlink to %s leaves the manifests directory %s; not read", path, target, dir)
			}
		}
	}
	if err := checkManifestFile(path, st, via, maxSize); err != nil {
		return nil, err
	}
	// The file is opened by its resolved path (os.Root refuses absolute
	// symlinks, even to a file inside), under os.Root, which refuses a path
	// that leaves the directory, also if a symlink changes after the checks
	// above.
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	if st, err = f.Stat(); err != nil {
		return nil, err
	}
	if err := checkManifestFile(path, st, via, maxSize); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	buf.Grow(int(st.Size()) + bytes.MinRead)
	if _, err := buf.ReadFrom(io.LimitReader(f, maxSize+1)); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if int64(buf.Len()) > maxSize {
		return nil, fmt.Errorf("%s: grew past %d bytes while read, larger than manifest_max_file_size allows (%d bytes); not read", path, maxSize, maxSize)
	}
	return buf.Bytes(), nil
}

// checkManifestFile refuses what is not a regular file, or is larger than
// maxSize bytes.
func checkManifestFile(path string, st fs.FileInfo, via string, maxSize int64) error {
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s: a %s%s, not a regular file; not read", path, fileType(st.Mode()), via)
	}
	if st.Size() > maxSize {
		return fmt.Errorf("%s: %d bytes%s, larger than manifest_max_file_size allows (%d bytes); not read", path, st.Size(), via, maxSize)
	}
	return nil
}

// resolveInside resolves every symlink of path, and tells whether the
// file it names is inside dir, and by which path relative to it.
func resolveInside(dir, path string) (rel string, inside bool, err error) {
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", false, err
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", false, err
	}
	rel, err = filepath.Rel(realDir, real)
	return rel, err == nil && filepath.IsLocal(rel), nil
}

// fileType names the type of a file that is not a regular file.
func fileType(mode fs.FileMode) string {
	switch {
	case mode&fs.ModeNamedPipe != 0:
		return "FIFO"
	case mode&fs.ModeSocket != 0:
		return "socket"
	case mode&fs.ModeCharDevice != 0:
		return "character device"
	case mode&fs.ModeDevice != 0:
		return "block device"
	case mode.IsDir():
		return "directory"
	}
	return "special file (" + mode.Type().String() + ")"
}

// decodeManifest decodes the content of the manifest file path. YAML and
// JSON are text: a NUL byte (as a crash can leave in a file whose blocks
// were never written) makes the file an error, not an empty file.
func decodeManifest(path string, data []byte) ([]runtime.Object, error) {
	if i := bytes.IndexByte(data, 0); i >= 0 {
		return nil, fmt.Errorf("%s: NUL byte at offset %d: not a YAML or JSON text file", path, i)
	}
	var out []runtime.Object
	doc := 0
	for raw, err := range yamlDocuments(data) {
		doc++
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 || isOnlyComments(raw) {
			continue
		}
		objs, err := decodeDocument(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
		out = append(out, objs...)
	}
	return out, nil
}

// yamlDocuments yields the documents of a YAML stream exactly as
// k8s.io/apimachinery's YAMLReader reads them: line by line, each line's
// end made "\n" (a "\r\n" too, and the last line given one); a line that
// starts with "---" ends the document read so far, if it has anything,
// and is otherwise its first line; what follows "---" may be only white
// space or a comment, else the stream is in error. A document is a slice
// of data where no line needed its end changed: the reader copied every
// line into a growing buffer, a quarter of reading a hundred thousand
// Services' manifests.
func yamlDocuments(data []byte) iter.Seq2[[]byte, error] {
	return func(yield func([]byte, error) bool) {
		from, to := 0, 0  // the document so far, when a slice of data
		var copied []byte // the document so far, when copied
		for at := 0; at < len(data); {
			next, line, clean := len(data), data[at:], false
			if i := bytes.IndexByte(line, '\n'); i >= 0 {
				next, line = at+i+1, line[:i]
				if clean = len(line) == 0 || line[len(line)-1] != '\r'; !clean {
					line = line[:len(line)-1]
				}
			}
			if rest, ok := bytes.CutPrefix(line, []byte("---")); ok {
				if t := strings.TrimSpace(string(rest)); t != "" && t[0] != '#' {
					yield(nil, fmt.Errorf("invalid Yaml document separator: %s", t))
					return
				}
				if copied != nil || to > from {
					doc := data[from:to]
					if copied != nil {
						doc = copied
					}
					if !yield(doc, nil) {
						return
					}
					from, to, copied, at = next, next, nil, next
					continue
				}
			}
			switch {
			case copied == nil && clean:
				to = next
			case copied == nil:
				copied = append(bytes.Clone(data[from:to]), line...)
				copied = append(copied, '\n')
			default:
				copied = append(append(copied, line...), '\n')
			}
			at = next
		}
		if copied != nil {
			yield(copied, nil)
		} else if to > from {
			yield(data[from:to], nil)
		}
	}
}

func isOnlyComments(doc []byte) bool {
	for _, line := range bytes.Split(doc, []byte("\n")) {
		l := bytes.TrimSpace(line)
		if len(l) > 0 && l[0] != '#' && !bytes.Equal(l, []byte("---")) {
			return false
		}
	}
	return true
}

// typeMeta is what every document must have, read before the full decode
// so that unrelated kinds are skipped without error.
type typeMeta struct {
	APIVersion, Kind string
	Items            [][]byte // the items of a List
}

// wantedKind tells whether a document of this type is decoded.
func wantedKind(apiVersion, kind string) bool {
	return (apiVersion == "v1" && kind == "Service") ||
		(apiVersion == "discovery.k8s.io/v1" && kind == "EndpointSlice")
}

// typeMetaDecoders are readTypeMeta's decoders.
var typeMetaDecoders = sync.Pool{New: func() any { return jsontext.NewDecoder(bytes.NewBuffer(nil)) }}

// readTypeMeta reads a JSON document's apiVersion, kind and, for a List,
// items, with a tokenizer that skips every other member without decoding
// it. It stops as soon as it knows the document is a Service or an
// EndpointSlice: the strict decode that follows reads all of it again,
// and a second full pass over every document was most of the cost of a
// cold start at a hundred thousand Services. The document is otherwise
// read to its end, so a malformed document of another kind is an error.
// Duplicate members and invalid UTF-8 are left to the strict decode, as
// encoding/json leaves them.
func readTypeMeta(doc []byte) (typeMeta, error) {
	var tm typeMeta
	// A decoder is a few kilobytes: one per document was a tenth of
	// reading a hundred thousand Services' manifests. Reading from a
	// bytes.Buffer, it reads doc in place.
	d := typeMetaDecoders.Get().(*jsontext.Decoder)
	d.Reset(bytes.NewBuffer(doc), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	defer func() {
		d.Reset(bytes.NewBuffer(nil)) // holds on to no document
		typeMetaDecoders.Put(d)
	}()
	tok, err := d.ReadToken()
	if err != nil {
		return tm, err
	}
	if tok.Kind() != '{' {
		return tm, fmt.Errorf("a JSON %s, not an object", kindName(tok.Kind()))
	}
	var hasVersion, hasKind bool
	for d.PeekKind() != '}' {
		tok, err := d.ReadToken()
		if err != nil {
			return tm, err
		}
		switch name := tok.String(); name {
		case "apiVersion", "kind":
			v, err := d.ReadToken()
			if err != nil {
				return tm, err
			}
			var str string
			switch v.Kind() {
			case '"':
				str = v.String()
			case 'n': // null, as encoding/json reads it: no value
			default:
				return tm, fmt.Errorf("%s: a JSON %s, not a string", name, kindName(v.Kind()))
			}
			if name == "kind" {
				tm.Kind, hasKind = str, true
			} else {
				tm.APIVersion, hasVersion = str, true
			}
			if hasVersion && hasKind && wantedKind(tm.APIVersion, tm.Kind) {
				return tm, nil
			}
		case "items":
			if d.PeekKind() != '[' {
				if err := d.SkipValue(); err != nil {
					return tm, err
				}
				continue
			}
			if _, err := d.ReadToken(); err != nil {
				return tm, err
			}
			tm.Items = tm.Items[:0]
			for d.PeekKind() != ']' {
				v, err := d.ReadValue()
				if err != nil {
					return tm, err
				}
				tm.Items = append(tm.Items, bytes.Clone(v))
			}
			if _, err := d.ReadToken(); err != nil {
				return tm, err
			}
		default:
			if err := d.SkipValue(); err != nil {
				return tm, err
			}
		}
	}
	if _, err := d.ReadToken(); err != nil {
		return tm, err
	}
	if _, err := d.ReadToken(); err != io.EOF {
		if err == nil {
			err = errors.New("more than one JSON value")
		}
		return tm, err
	}
	return tm, nil
}

// kindName names a JSON value's kind for an error.
func kindName(k jsontext.Kind) string {
	switch k {
	case '"':
		return "string"
	case '0':
		return "number"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	case '[':
		return "array"
	case '{':
		return "object"
	}
	return "value"
}

// strictError words an unknown or a duplicate field as Kubernetes' strict
// codec does, naming the field by its path (spec.ports[0].port), and a
// value of the wrong type with the field, the value and the type wanted.
// (The decoder's own words change from process to process on purpose:
// "cannot" or "unable to".) Malformed JSON keeps the decoder's words.
func strictError(doc []byte, err error) error {
	var se *json.SemanticError
	if errors.As(err, &se) {
		if se.Err == json.ErrUnknownName {
			return fmt.Errorf("strict decoding error: unknown field %q", fieldPath(se.JSONPointer))
		}
		var b strings.Builder
		fmt.Fprintf(&b, "field %q: cannot decode", fieldPath(se.JSONPointer))
		if se.JSONKind != 0 {
			b.WriteString(" a JSON " + kindName(se.JSONKind))
		}
		if v := valueAt(doc, se); len(v) > 0 && len(v) <= 64 {
			b.WriteString(" " + string(v))
		}
		if se.GoType != nil {
			b.WriteString(" into " + se.GoType.String())
		}
		if se.Err != nil {
			b.WriteString(": " + se.Err.Error())
		}
		return errors.New(b.String())
	}
	var sy *jsontext.SyntacticError
	if errors.As(err, &sy) && errors.Is(sy.Err, jsontext.ErrDuplicateName) {
		return fmt.Errorf("strict decoding error: duplicate field %q", fieldPath(sy.JSONPointer))
	}
	return err
}

// valueAt is the scalar value the decoder refused, from the error or read
// from the document at the error's offset; nil for an object or array.
func valueAt(doc []byte, se *json.SemanticError) jsontext.Value {
	v := se.JSONValue
	if len(v) == 0 && se.ByteOffset >= 0 && se.ByteOffset < int64(len(doc)) {
		v, _ = jsontext.NewDecoder(bytes.NewReader(doc[se.ByteOffset:])).ReadValue()
	}
	if k := v.Kind(); k == '{' || k == '[' {
		return nil
	}
	return v
}

// fieldPath writes a JSON pointer as a field's path: an array index as
// [i], a member name after a dot.
func fieldPath(p jsontext.Pointer) string {
	var b strings.Builder
	for tok := range p.Tokens() {
		if _, err := strconv.ParseUint(tok, 10, 32); err == nil && b.Len() > 0 {
			b.WriteString("[" + tok + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tok)
	}
	return b.String()
}

func decodeDocument(raw []byte) ([]runtime.Object, error) {
	jsonDoc, err := utilyaml.ToJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("not YAML or JSON: %w", err)
	}
	tm, err := readTypeMeta(jsonDoc)
	if err != nil {
		return nil, fmt.Errorf("not a Kubernetes object: %w", err)
	}
	switch {
	case tm.Kind == "":
		return nil, errors.New("kind is missing")
	case tm.APIVersion == "":
		return nil, fmt.Errorf("%s: apiVersion is missing", tm.Kind)
	case strings.HasSuffix(tm.Kind, "List"):
		var out []runtime.Object
		for i, item := range tm.Items {
			objs, err := decodeDocument(item)
			if err != nil {
				return nil, fmt.Errorf("items[%d]: %w", i, err)
			}
			out = append(out, objs...)
		}
		return out, nil
	}
	if !wantedKind(tm.APIVersion, tm.Kind) {
		return nil, nil
	}
	// Decoded once, strictly: unknown and duplicate fields are errors,
	// as with Kubernetes' strict codec (which read the type twice more),
	// and names are matched case-sensitively, as there. The decoder is
	// go-json-experiment's, which decodes the same objects
	// (TestDecodeDocumentAsTheStrictCodec) in half the time and
	// allocations of sigs.k8s.io/json's strict one (BenchmarkDecodeDocument):
	// decoding was most of a cold start's time before the first sync.
	var obj runtime.Object
	switch tm.Kind {
	case "Service":
		obj = &corev1.Service{}
	default:
		obj = &discoveryv1.EndpointSlice{}
	}
	if err := json.Unmarshal(jsonDoc, obj, json.RejectUnknownMembers(true)); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, strictError(jsonDoc, err))
	}
	switch o := obj.(type) {
	case *corev1.Service:
		if o.Namespace == "" {
			o.Namespace = "default"
		}
		if o.Name == "" {
			return nil, errors.New("Service: metadata.name is missing")
		}
	case *discoveryv1.EndpointSlice:
		if o.Namespace == "" {
			o.Namespace = "default"
		}
		if o.Name == "" {
			return nil, errors.New("EndpointSlice: metadata.name is missing")
		}
		if _, ok := model.SliceService(o); !ok {
			return nil, fmt.Errorf("EndpointSlice %s: label %s is missing", o.Name, model.LabelServiceName)
		}
	}
	return []runtime.Object{obj}, nil
}

// Feed records decoded objects in a sink, as a source would.
func Feed(t Sink, objs []runtime.Object) {
	for _, o := range objs {
		switch obj := o.(type) {
		case *corev1.Service:
			if st, ok := t.(ServiceStage); ok {
				st.SetService(obj, "")
				continue
			}
			t.SetServiceObject(model.NewServiceObject(obj))
		case *discoveryv1.EndpointSlice:
			t.SetSliceObject(model.NewSliceObject(obj))
		}
	}
}
