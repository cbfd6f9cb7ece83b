package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"sort"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-proxy/sluice/lb"
)

// Sink receives what a source decides. Publish gets each new snapshot (never
// a no-op one); Unchanged is called when a re-read changed nothing; Reject
// gets each update that was refused, while the last good snapshot keeps
// serving; Queued is called when a change is noticed, before it is processed
// (healthz uses it to detect staleness).
type Sink interface {
	Publish(*lb.Snapshot)
	Unchanged()
	Reject(error)
	Queued()
}

// TimedSink is a Sink that is also told when the changes a snapshot
// carries began, to measure how long they took to reach the data plane.
// A source publishes through PublishTimed when its sink has it.
type TimedSink interface {
	Sink
	PublishTimed(*lb.Snapshot, UpdateTimes)
}

// UpdateTimes are when the changes in one published snapshot began.
type UpdateTimes struct {
	// Triggers are the EndpointSlices' endpoints.kubernetes.io/
	// last-change-trigger-time annotations (when the controller saw the
	// pod change), as kube-proxy's network programming latency takes them.
	Triggers []Trigger
	// Arrived is when each change reached sluice (an API event, a file
	// event).
	Arrived []time.Time
}

// Trigger is one EndpointSlice change's trigger time and IP family
// ("IPv4", "IPv6": the slice's address type).
type Trigger struct {
	Family string
	At     time.Time
}

// PublishTo hands snap to sink, with times when the sink takes them.
func PublishTo(sink Sink, snap *lb.Snapshot, times UpdateTimes) {
	if ts, ok := sink.(TimedSink); ok && (len(times.Triggers) > 0 || len(times.Arrived) > 0) {
		ts.PublishTimed(snap, times)
		return
	}
	sink.Publish(snap)
}

// ManifestSource serves Services and endpoints from manifest files and
// watches them. The zero value is not usable: set Path and Sink.
type ManifestSource struct {
	Path string
	Sink Sink
	Log  *slog.Logger
	// NodeName marks endpoints on this node local (see BuildFor).
	NodeName string
	// IgnoreNodeHints drops the EndpointSlices' node hints as they are
	// read, as kube-proxy does with its PreferSameTrafficDistribution gate
	// off; zone hints are still read.
	IgnoreNodeHints bool
	// Coalesce is how long to wait after a file event for more, so that an
	// editor's burst of writes becomes one reload. Default 100ms.
	Coalesce time.Duration
	// Resync re-reads the files this often even without events (like
	// kube-proxy's --config-sync-period). Zero disables it.
	Resync time.Duration
	// After is the timer, injectable for tests; default time.After.
	After func(time.Duration) <-chan time.Time
	// Now is the clock of the update times; default time.Now.
	Now func() time.Time
	// Reserved are the host ports sluice itself holds (its health and
	// metrics servers, its proxy port range): a manifest NodePort on one
	// is refused at validation, naming both owners.
	Reserved []HostPort
	// MaxBytes bounds what one load reads; a load over it is refused.
	// Default DefaultMaxManifestBytes; negative: no limit.
	MaxBytes int64
	// NodePodCIDRs, when set, is told the pod CIDRs of this node's Node
	// object after each good read that finds one (as the API source tells
	// them, for --detect-local-mode=NodeCIDR).
	NodePodCIDRs func([]string)
	// NodeEligible, when set, is told after each good read whether this
	// node may take traffic (NodeEligible of its Node object; true when
	// the files hold none), for /healthz.
	NodeEligible func(bool)
	// NodeZone, when set, is told after each good read the zone the
	// topology hints are read for: its Node's zone label ("" with no Node
	// or no label).
	NodeZone func(string)

	last         *lb.Snapshot
	lastServices int // Services in the last good read
	// node is what the last good read said of this node's Node object
	// (its zone, or that there is none), once said.
	node *nodeSeen
	// skippedKinds are the kinds of objects skipped that have been
	// warned about, so each gets one warning, not one per reload.
	skippedKinds map[string]bool
	rejected     bool // the last read was refused
	cache        DocCache
	memo         BuildMemo

	// What the watch saw since the last read began: the files it had
	// events for, or that every file must be looked at (no watch, a watch
	// error such as an overflow, the directory recreated, an event for a
	// name that is no manifest file, such as a ConfigMap's ..data).
	touchMu    sync.Mutex
	watching   bool
	touched    map[string]bool
	touchedAll bool
	// renamed are the manifest names the watch saw made, removed or
	// renamed: unless touchedAll, the next read patches the last listing
	// with them instead of reading the directory (an edit in place leaves
	// the listing as it was; at 10k files a listing was a quarter of a
	// reload's CPU and most of its garbage).
	renamed map[string]bool
	// others: the watch saw events for names that are no manifest file
	// (an editor's temporary file, a ConfigMap's ..data). They matter only
	// when a manifest file is a symbolic link, which may lead through
	// them; see readPlan.
	others bool
	// linked: a manifest file of the last read was a symbolic link (the
	// DocCache's count, which only grows), so that events for other names
	// may change what is read.
	linked bool
}

// touch records a watch event for name (a path in the watched directory).
// It says whether the event calls for a reload (see record).
func (s *ManifestSource) touch(name string) bool { return s.record(name, false) }

// touchListing records a watch event that may have changed the
// directory's listing (a file made, removed or renamed) for name.
func (s *ManifestSource) touchListing(name string) bool { return s.record(name, true) }

// record records a watch event for name, and says whether it calls for a
// reload: an event for a manifest file does; one for any other name (an
// editor's or a tool's temporary file, written and then renamed over a
// manifest) does only while a manifest file is a symbolic link, which may
// lead through it (see readPlan). Otherwise the reload it caused changed
// nothing, and at 10k Services in one file it was a whole replay of the
// file (some 5 ms), often still running when the rename's event came.
func (s *ManifestSource) record(name string, listing bool) bool {
	s.touchMu.Lock()
	defer s.touchMu.Unlock()
	if !manifestName(filepath.Base(name)) {
		s.others = true
		return s.linked
	}
	if s.touched == nil {
		s.touched = map[string]bool{}
	}
	s.touched[name] = true
	if listing {
		if s.renamed == nil {
			s.renamed = map[string]bool{}
		}
		s.renamed[name] = true
	}
	return true
}

// touchAll makes the next read list the directory and look at every file.
func (s *ManifestSource) touchAll() {
	s.touchMu.Lock()
	s.touchedAll = true
	s.touchMu.Unlock()
}

func (s *ManifestSource) setWatching(on bool) {
	s.touchMu.Lock()
	s.watching, s.touchedAll, s.touched = on, true, nil
	s.touchMu.Unlock()
}

// takeTouched starts a read: what the watch saw until now, as
// DocCache.Touched (nil: every file), whether the listing is as the last
// read found it (DocCache.SameListing), else the names that may have come
// or gone since (DocCache.Renamed; nil: list the directory), and whether
// it saw names that are no manifest file; and a clean record for what it
// sees from now on.
func (s *ManifestSource) takeTouched() (touched func(string) bool, sameListing bool, renamed []string, others bool) {
	s.touchMu.Lock()
	defer s.touchMu.Unlock()
	t, all, others := s.touched, s.touchedAll || !s.watching, s.others
	if !all && len(s.renamed) > 0 {
		renamed = make([]string, 0, len(s.renamed))
		for name := range s.renamed {
			renamed = append(renamed, name)
		}
	}
	s.touched, s.touchedAll, s.others, s.renamed = nil, false, false, nil
	if all {
		return nil, false, nil, others
	}
	return func(file string) bool { return t[file] }, renamed == nil, renamed, others
}

// readPlan is what the next read looks at: the files the watch saw events
// for (nil: every file), and whether the directory's listing is as the
// last read found it. An event for a name that is no manifest file (an
// editor's temporary or backup file) changes nothing read while every
// manifest file the last listing found is a regular file: their own
// events name them. Once one is a symbolic link, such an event may be
// the swap of what it leads to (a ConfigMap's ..data), and every file is
// looked at, as before.
func (s *ManifestSource) readPlan() (touched func(string) bool, sameListing bool, renamed []string) {
	touched, sameListing, renamed, others := s.takeTouched()
	if others && s.cache.symlinks > 0 {
		return nil, false, nil
	}
	return touched, sameListing, renamed
}

// ErrWouldRemoveEveryService is why a reload that finds no Service, where
// the state being served has some, is refused: a directory emptied by a
// tool mid-way, or files replaced in the wrong order, would otherwise take
// every Service off the node at once. To empty a node on purpose, leave a
// manifest that says so: an empty List (apiVersion: v1, kind: List,
// items: []).
var ErrWouldRemoveEveryService = errors.New("would remove every Service; to serve none on purpose, leave a manifest holding an empty List (apiVersion: v1, kind: List, items: [])")

// bigLoad is the size of a load after which its memory is returned to
// the OS at once.
const bigLoad = 8 << 20

// Load reads and validates the manifests once and publishes the result. It
// is the start-up path: an error here should stop the process.
func (s *ManifestSource) Load() error {
	snap, services, err := s.read()
	if err != nil {
		return err
	}
	s.last, s.lastServices = snap, services
	s.Sink.Publish(snap)
	return nil
}

// read loads and builds the manifests; it also says how many Services
// they hold.
func (s *ManifestSource) read() (*lb.Snapshot, int, error) {
	limit := s.limit()
	s.cache.forNode(s.NodeName, s.IgnoreNodeHints)
	s.cache.now = s.Now
	s.cache.Touched, s.cache.SameListing, s.cache.Renamed = s.readPlan()
	objs, n, err := loadManifests(s.Path, &s.cache, limit)
	s.touchMu.Lock()
	s.linked = s.cache.symlinks > 0
	s.touchMu.Unlock()
	if n >= bigLoad {
		// Decoding took some ten times the size at its peak; hand it back
		// now rather than over the minutes the scavenger would take. Only
		// what was decoded counts: a reload that found one document
		// changed decoded one (forcing a GC for it cost ~10 ms at 10k).
		defer debug.FreeOSMemory()
	}
	if err != nil {
		return nil, 0, Locate(BoundErrors(err, MaxReportedErrors))
	}
	s.warnSkipped(objs.SkippedKinds())
	if len(objs.Services) == 0 && s.lastServices > 0 && !objs.ExplicitlyEmpty() {
		return nil, 0, fmt.Errorf("manifests %s: %w (%d served now)", s.Path, ErrWouldRemoveEveryService, s.lastServices)
	}
	s.memo.Reserved = s.Reserved
	snap, err := s.memo.Build(objs, s.NodeName)
	if err != nil {
		return nil, 0, Locate(BoundErrors(err, MaxReportedErrors))
	}
	if n := objs.Node(); n != nil && s.NodePodCIDRs != nil {
		s.NodePodCIDRs(PodCIDRs(n))
	}
	if s.NodeEligible != nil {
		s.NodeEligible(objs.Node() == nil || NodeEligible(objs.Node()))
	}
	if s.NodeZone != nil {
		zone, _, _ := objs.NodeZone()
		s.NodeZone(zone)
	}
	s.sayNode(objs) // last: once it is said, all of the above is done
	return snap, len(objs.Services), nil
}

// TaintToBeDeleted is the cluster autoscaler's taint on a node it is
// about to delete.
const TaintToBeDeleted = "ToBeDeletedByClusterAutoscaler"

// NodeEligible says whether a node may take traffic as kube-proxy's
// /healthz judges it: not while its Node is being deleted or carries
// TaintToBeDeleted.
func NodeEligible(n *corev1.Node) bool {
	if n.DeletionTimestamp != nil {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Key == TaintToBeDeleted {
			return false
		}
	}
	return true
}

// PodCIDRs are a Node's spec.podCIDRs, or its older spec.podCIDR alone.
func PodCIDRs(n *corev1.Node) []string {
	if len(n.Spec.PodCIDRs) == 0 && n.Spec.PodCIDR != "" {
		return []string{n.Spec.PodCIDR}
	}
	return n.Spec.PodCIDRs
}

// limit is what one load may read (0: no limit), from MaxBytes.
func (s *ManifestSource) limit() int64 {
	switch {
	case s.MaxBytes == 0:
		return DefaultMaxManifestBytes
	case s.MaxBytes < 0:
		return 0
	}
	return s.MaxBytes
}

// Prime reads the files before Load, neither building nor publishing what
// they hold, and returns this node's Node object in them (nil: none):
// what a node's start-up needs of its Node before the data plane is made.
// The documents it decoded stay in the source's cache, so the Load after
// it decodes none of them again (a start-up read twice was twice the
// decoding at 10k Services). A load Load would refuse is the same error.
func (s *ManifestSource) Prime() (*corev1.Node, error) {
	s.cache.forNode(s.NodeName, s.IgnoreNodeHints)
	s.cache.now = s.Now
	objs, _, err := loadManifests(s.Path, &s.cache, s.limit())
	if err != nil {
		return nil, Locate(BoundErrors(err, MaxReportedErrors))
	}
	return objs.Node(), nil
}

type nodeSeen struct {
	zone  string
	found bool
}

// sayNode logs this node's zone when a read finds it other than the last
// good one did: the zone hints of every Service follow it.
func (s *ManifestSource) sayNode(objs *Objects) {
	zone, at, found := objs.NodeZone()
	now := nodeSeen{zone, found}
	if s.node != nil && *s.node == now || s.node == nil && !found {
		return
	}
	s.node = &now
	switch {
	case !found:
		s.logger().Info("manifests: no Node object for this node any more; zone hints are not followed", "node", s.NodeName)
	case zone == "":
		s.logger().Info("manifests: this node's Node object has no zone label; zone hints are not followed", "node", s.NodeName, "at", at, "label", corev1.LabelTopologyZone)
	default:
		s.logger().Info("manifests: this node's zone, for the zone hints", "node", s.NodeName, "zone", zone, "at", at)
	}
}

// warnSkipped warns once about each kind of object the manifests hold and
// sluice does not read (an application's Deployment beside its Service), so
// that an operator knows it was seen and left alone; a kind that goes and
// comes back is warned about again.
func (s *ManifestSource) warnSkipped(kinds map[string]SkippedKind) {
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if !s.skippedKinds[k] {
			s.logger().Warn("manifests: objects of a kind sluice does not read are skipped", "kind", k, "count", kinds[k].Count, "first", kinds[k].First)
		}
	}
	s.skippedKinds = make(map[string]bool, len(kinds))
	for k := range kinds {
		s.skippedKinds[k] = true
	}
}

// Reload reads the manifests again, looking at every file. A bad update is
// rejected and the last good snapshot stays; an update that changes
// nothing is dropped.
func (s *ManifestSource) Reload() {
	s.touchAll()
	s.reload(UpdateTimes{})
}

// reload is Reload; a published snapshot goes out with times.
func (s *ManifestSource) reload(times UpdateTimes) {
	snap, services, err := s.read()
	if err != nil {
		s.Sink.Reject(err) // counted before it is logged, so a reader of the log finds it counted
		// One line per problem (they are bounded): joined, they made one
		// line of literal \n's.
		errs := leaves(err)
		for _, e := range errs {
			s.logger().Error("manifest update rejected; still serving the last good state", "path", s.Path, "err", e, "problems", len(errs))
		}
		s.rejected = true
		return
	}
	if s.rejected {
		s.rejected = false
		s.logger().Info("manifests accepted again", "path", s.Path)
	}
	if s.last != nil && reflect.DeepEqual(s.last, snap) {
		s.Sink.Unchanged()
		return
	}
	s.last, s.lastServices = snap, services
	PublishTo(s.Sink, snap, times)
}

// leaves flattens errors.Join trees (a ManifestError is one leaf).
func leaves(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		if _, me := err.(*ManifestError); !me {
			var out []error
			for _, e := range j.Unwrap() {
				out = append(out, leaves(e)...)
			}
			return out
		}
	}
	return []error{err}
}

func (s *ManifestSource) logger() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

// Run watches the path until ctx ends. Load must have succeeded first.
func (s *ManifestSource) Run(ctx context.Context) error {
	after := s.After
	if after == nil {
		after = time.After
	}
	coalesce := s.Coalesce
	if coalesce <= 0 {
		coalesce = 100 * time.Millisecond
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", s.Path, err)
	}
	// Watch the directory: editors and kubectl-style tools replace files by
	// rename, which a watch on the file itself would lose.
	dir, only, anyName := filepath.Clean(s.Path), "", false
	if fi, err := os.Stat(s.Path); err == nil && !fi.IsDir() {
		dir, only = filepath.Dir(dir), dir
		if li, err := os.Lstat(s.Path); err == nil && li.Mode()&os.ModeSymlink != 0 {
			// A ConfigMap's file is a link through ..data, which kubelet
			// swaps: the file's own name sees no event, so any will do.
			only, anyName = "", true
		}
	}
	if err := w.Add(dir); err != nil {
		w.Close()
		return fmt.Errorf("watch %s: %w", dir, err)
	}
	// The parent is watched too, for the directory itself being deleted
	// and created again (a watch ends with the directory it watched).
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := w.Add(parent); err != nil {
			s.logger().Warn("cannot watch the manifest directory's parent; a deleted and recreated directory will be noticed only at the next resync", "path", parent, "err", err)
		}
	}
	// An edit between Load and the watch being set up raised no event:
	// read once more, every file, now that every later edit will.
	s.setWatching(true)
	defer s.setWatching(false)
	s.Reload()
	changes := make(chan struct{})
	go func() {
		defer close(changes)
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				name := filepath.Clean(ev.Name)
				switch {
				case name == dir:
					if ev.Op.Has(fsnotify.Create) {
						// Forget the old watch first: its end (IN_IGNORED)
						// may not have been processed yet, and fsnotify
						// would then drop the new one along with it.
						w.Remove(dir)
						if err := w.Add(dir); err != nil {
							s.logger().Warn("manifest directory recreated but cannot be watched", "path", dir, "err", err)
						} else {
							s.logger().Info("manifest directory recreated; watching it again", "path", dir)
						}
					}
					// Removed: the reload fails and is rejected; the last
					// good state keeps serving.
				case filepath.Dir(name) != dir:
					continue // the parent's other entries
				case only != "" && name != only:
					continue
				}
				switch {
				case name == dir:
					s.touchAll()
				case ev.Op.Has(fsnotify.Create) || ev.Op.Has(fsnotify.Remove) || ev.Op.Has(fsnotify.Rename):
					if !s.touchListing(name) && !anyName {
						continue
					}
				default: // a write or an attribute change: same names
					if !s.touch(name) && !anyName {
						continue
					}
				}
				// Chmod counts: a permission fix makes a file readable.
				select {
				case changes <- struct{}{}:
				case <-ctx.Done():
					return
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				s.logger().Warn("manifest watch error", "path", s.Path, "err", err)
				// Events may have been lost (an overflow): look at every
				// file at the next reload, and have one come.
				s.touchAll()
				select {
				case changes <- struct{}{}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	s.coalesce(ctx, changes, after, coalesce)
	w.Close()
	for range changes { // wait for the watcher goroutine to end
	}
	return nil
}

// coalesce turns a stream of change notices into reloads: the first notice
// of a burst is reported as Queued and arms one timer; notices until it
// fires join the same reload.
func (s *ManifestSource) coalesce(ctx context.Context, changes <-chan struct{}, after func(time.Duration) <-chan time.Time, wait time.Duration) {
	var resync <-chan time.Time
	if s.Resync > 0 {
		resync = after(s.Resync)
	}
	var pending <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-changes:
			if !ok {
				return
			}
			if pending == nil {
				s.Sink.Queued()
				pending = after(wait)
			}
		case <-pending:
			pending = nil
			// Timed from here: the --manifest-coalesce wait before it is a
			// setting, not work.
			now := time.Now
			if s.Now != nil {
				now = s.Now
			}
			s.reload(UpdateTimes{Arrived: []time.Time{now()}})
		case <-resync:
			resync = after(s.Resync)
			s.Reload()
		}
	}
}
