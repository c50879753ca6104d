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
type ServiceList struct {
	t   *btree.BTreeG[*Service]
	sum SummaryJSON
}

// serviceListDegree is the B-tree's degree: a change copies about
// log_degree(N) nodes of up to 2 × degree pointers.
const serviceListDegree = 32

func lessService(a, b *Service) bool {
	return a.Namespace < b.Namespace || a.Namespace == b.Namespace && a.Name < b.Name
}

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

// All yields the Services in name order. They must not be modified.
func (l ServiceList) All() iter.Seq[*Service] {
	return func(yield func(*Service) bool) {
		if l.t != nil {
			l.t.Ascend(yield)
		}
	}
}

// Get returns the Service namespace/name.
func (l ServiceList) Get(namespace, name string) (*Service, bool) {
	if l.t == nil {
		return nil, false
	}
	return l.t.Get(&Service{Namespace: namespace, Name: name})
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
	out := ServiceList{sum: l.sum}
	if l.t == nil {
		out.t = btree.NewG(serviceListDegree, lessService)
	} else {
		out.t = l.t.Clone()
	}
	for i := range remove {
		if old, ok := out.t.Delete(&remove[i]); ok {
			out.sum.count(old, -1)
		}
	}
	for i := range set {
		row := &set[i]
		if old, ok := out.t.ReplaceOrInsert(row); ok {
			out.sum.count(old, -1)
		}
		out.sum.count(row, 1)
	}
	return out
}

// count adds one Service's part of the summary (sign 1) or takes it off
// (sign -1); Total is the list's length, not counted here.
func (s *SummaryJSON) count(svc *Service, sign int) {
	if svc.Error != "" {
		s.Rejected += sign
	}
	if svc.KernelError != "" {
		s.KernelRefused += sign
	}
	if len(svc.Warnings) > 0 {
		s.WithWarnings += sign
	}
	total, used := svc.endpointCounts()
	if used == 0 && svc.Type != "ExternalName" && svc.Type != "" {
		s.NoEndpoints += sign
	}
	s.Endpoints += sign * total
}
