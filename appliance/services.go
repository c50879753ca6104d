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
// A Source of many Services gives them as data its Rows make rows of: the
// list keeps the data and the row's part of the summary, and makes the
// row when it is shown. Rows kept made were the largest part of the
// gateway's memory after the rules' (43 MB of 234 at 100,000 Services);
// the name and the maker kept with each row, 4 MB at 100,000.
type ServiceList struct {
	t    *btree.BTreeG[entry]
	rows Rows
	sum  SummaryJSON
}

// Rows are what a list's data are: Name returns the namespace and name of
// one, Make its row, the same every time. Make is called once when the
// data is put in (for the summary) and again whenever the row is read.
// A list holds the data of one Rows, which it compares with ==: a Rows
// must be of a comparable type (a pointer, say).
type Rows interface {
	Name(data any) (namespace, name string)
	Make(data any) Service
}

// ServiceName names a row to take out of a list.
type ServiceName struct{ Namespace, Name string }

// entry is one Service in the list: its data and its part of the summary.
type entry struct {
	data      any // a *ServiceName when the entry is a probe for a name
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
// log_degree(N) nodes of up to 2 × degree entries.
const serviceListDegree = 32

// name returns the name of e's Service.
func name(rows Rows, e entry) (namespace, name string) {
	if n, ok := e.data.(*ServiceName); ok {
		return n.Namespace, n.Name
	}
	return rows.Name(e.data)
}

func newTree(rows Rows) *btree.BTreeG[entry] {
	return btree.NewG(serviceListDegree, func(a, b entry) bool {
		ans, an := name(rows, a)
		bns, bn := name(rows, b)
		return ans < bns || ans == bns && an < bn
	})
}

// wholeRows are the Rows of Services given whole: the data is the
// *Service.
type wholeRows struct{}

func (wholeRows) Name(data any) (string, string) {
	s := data.(*Service)
	return s.Namespace, s.Name
}

func (wholeRows) Make(data any) Service { return *data.(*Service) }

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
			l.t.Ascend(func(e entry) bool {
				s := l.rows.Make(e.data)
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
	e, ok := l.t.Get(entry{data: &ServiceName{namespace, name}})
	if !ok {
		return nil, false
	}
	s := l.rows.Make(e.data)
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
	data := make([]any, len(set))
	for i := range set {
		data[i] = &set[i]
	}
	names := make([]ServiceName, len(remove))
	for i := range remove {
		names[i] = ServiceName{remove[i].Namespace, remove[i].Name}
	}
	return l.WithRows(wholeRows{}, data, names...)
}

// WithRows is With for the data of rows: the data in set are put in, each
// replacing the row of its name, the rows named by remove taken out. A
// list of other Rows is replaced whole: none of its rows is kept.
func (l ServiceList) WithRows(rows Rows, set []any, remove ...ServiceName) ServiceList {
	out := ServiceList{rows: rows, sum: l.sum}
	if l.t == nil || l.rows != rows {
		out.t, out.sum = newTree(rows), SummaryJSON{}
	} else {
		out.t = l.t.Clone()
	}
	for i := range remove {
		if old, ok := out.t.Delete(entry{data: &remove[i]}); ok {
			out.sum.count(old, -1)
		}
	}
	for _, d := range set {
		e := newEntry(rows, d)
		if old, ok := out.t.ReplaceOrInsert(e); ok {
			out.sum.count(old, -1)
		}
		out.sum.count(e, 1)
	}
	return out
}

// newEntry makes data's row once, for its part of the summary.
func newEntry(rows Rows, data any) entry {
	svc := rows.Make(data)
	e := entry{data: data}
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
func (s *SummaryJSON) count(e entry, sign int) {
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
