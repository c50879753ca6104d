package appliance

import (
	"iter"

	"github.com/google/btree"
)

// ServiceList is the Services shown, in name order, with their summary.
// It never changes: With returns a new list that shares everything but
// what changed with the old one (a copy-on-write B-tree), so replacing a
// few rows among a hundred thousand costs what it changes, and a Snapshot
// taken before keeps showing its own list. The zero ServiceList is empty.
//
// A Source of many Services gives them as Rows: the list keeps what makes
// a row and the row's part of the summary, and makes the row when it is
// shown. Rows kept made were the largest part of the gateway's memory
// after the rules' (43 MB of 234 at 100,000 Services).
type ServiceList struct {
	t   *btree.BTreeG[*entry]
	sum SummaryJSON
}

// A Row is a Service's row as the list keeps it until it is shown: Make
// (Data) returns the row, the same every time, and Namespace and Name are
// its name. Make is called once when the Row is put in (for the summary)
// and again whenever the row is read.
type Row struct {
	Namespace, Name string
	Data            any
	Make            func(data any) Service
}

// entry is one Service in the list: its Row and its part of the summary.
type entry struct {
	Row
	endpoints int32
	flags     uint8
}

const (
	rowRejected = 1 << iota
	rowKernelRefused
	rowWithWarnings
	rowNoEndpoints
)

// serviceListDegree is the B-tree's degree: a change copies about
// log_degree(N) nodes of up to 2 × degree pointers.
const serviceListDegree = 32

func lessEntry(a, b *entry) bool {
	return a.Namespace < b.Namespace || a.Namespace == b.Namespace && a.Name < b.Name
}

// wholeRow is the Make of a row given whole: Data is the *Service.
func wholeRow(data any) Service { return *data.(*Service) }

// NewServiceList returns the list of the given Services (a later one
// replaces an earlier one of the same name). It keeps the rows of
// services, as With does.
func NewServiceList(services ...Service) ServiceList {
	return ServiceList{}.With(services)
}

// Len is the number of Services.
func (l ServiceList) Len() int {
	if l.t == nil {
		return 0
	}
	return l.t.Len()
}

// All yields the Services in name order, each row made as it is yielded.
// They must not be modified.
func (l ServiceList) All() iter.Seq[*Service] {
	return func(yield func(*Service) bool) {
		if l.t != nil {
			l.t.Ascend(func(e *entry) bool {
				s := e.Make(e.Data)
				return yield(&s)
			})
		}
	}
}

// Get returns the Service namespace/name.
func (l ServiceList) Get(namespace, name string) (*Service, bool) {
	if l.t == nil {
		return nil, false
	}
	e, ok := l.t.Get(&entry{Row: Row{Namespace: namespace, Name: name}})
	if !ok {
		return nil, false
	}
	s := e.Make(e.Data)
	return &s, true
}

// Summary counts the Services by condition.
func (l ServiceList) Summary() SummaryJSON {
	s := l.sum
	s.Total = l.Len()
	return s
}

// With returns the list with the given rows put in, each replacing the row
// of its name, and the rows named by remove (only their Namespace and Name
// are read) taken out. l is left as it is. The list keeps the rows of set
// where they are, without a copy: the caller must not modify them
// afterwards.
func (l ServiceList) With(set []Service, remove ...Service) ServiceList {
	rows := make([]Row, len(set))
	for i := range set {
		rows[i] = Row{Namespace: set[i].Namespace, Name: set[i].Name, Data: &set[i], Make: wholeRow}
	}
	names := make([]Row, len(remove))
	for i := range remove {
		names[i] = Row{Namespace: remove[i].Namespace, Name: remove[i].Name}
	}
	return l.WithRows(rows, names...)
}

// WithRows is With for Rows: the rows of set are put in, those named by
// remove (only their Namespace and Name are read) taken out.
func (l ServiceList) WithRows(set []Row, remove ...Row) ServiceList {
	out := ServiceList{sum: l.sum}
	if l.t == nil {
		out.t = btree.NewG(serviceListDegree, lessEntry)
	} else {
		out.t = l.t.Clone()
	}
	for i := range remove {
		if old, ok := out.t.Delete(&entry{Row: remove[i]}); ok {
			out.sum.count(old, -1)
		}
	}
	for i := range set {
		e := newEntry(set[i])
		if old, ok := out.t.ReplaceOrInsert(e); ok {
			out.sum.count(old, -1)
		}
		out.sum.count(e, 1)
	}
	return out
}

// newEntry makes r's row once, for its part of the summary.
func newEntry(r Row) *entry {
	svc := r.Make(r.Data)
	e := &entry{Row: r}
	if svc.Error != "" {
		e.flags |= rowRejected
	}
	if svc.KernelError != "" {
		e.flags |= rowKernelRefused
	}
	if len(svc.Warnings) > 0 {
		e.flags |= rowWithWarnings
	}
	total, used := svc.endpointCounts()
	if used == 0 && svc.Type != "ExternalName" && svc.Type != "" {
		e.flags |= rowNoEndpoints
	}
	e.endpoints = int32(total)
	return e
}

// count adds one Service's part of the summary (sign 1) or takes it off
// (sign -1); Total is the list's length, not counted here.
func (s *SummaryJSON) count(e *entry, sign int) {
	flag := func(f uint8) int {
		if e.flags&f != 0 {
			return sign
		}
		return 0
	}
	s.Rejected += flag(rowRejected)
	s.KernelRefused += flag(rowKernelRefused)
	s.WithWarnings += flag(rowWithWarnings)
	s.NoEndpoints += flag(rowNoEndpoints)
	s.Endpoints += sign * int(e.endpoints)
}
