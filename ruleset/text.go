package ruleset

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"
)

// WriteText writes family f's table, built from the given fragments, as an
// nft script (`nft -f` reads it). It is for people and for tests; the kernel
// is always programmed over netlink.
func WriteText(w io.Writer, table string, f Family, frags ...*Fragment) error {
	var chains []*Chain
	var sets []*Set
	var flowtables []*Flowtable
	elems := map[string][]Element{}
	// Several fragments may list the same shared chain or set: written once.
	shared := map[string]bool{}
	first := func(kind, name string) bool {
		if !Shared(name) {
			return true
		}
		seen := shared[kind+name]
		shared[kind+name] = true
		return !seen
	}
	for _, fr := range frags {
		for _, c := range fr.Chains {
			if first("c/", c.Name) {
				chains = append(chains, c)
			}
		}
		for _, s := range fr.Sets {
			if first("s/", s.Name) {
				sets = append(sets, s)
			}
		}
		flowtables = append(flowtables, fr.Flowtables...)
		for _, e := range fr.Elements {
			elems[e.Map] = append(elems[e.Map], e)
		}
		for i := range fr.Picks {
			for _, e := range fr.Picks[i].AppendElements(nil) {
				elems[e.Map] = append(elems[e.Map], e)
			}
		}
	}
	sort.SliceStable(chains, func(i, j int) bool {
		if (chains[i].Hook != nil) != (chains[j].Hook != nil) {
			return chains[i].Hook != nil
		}
		return chains[i].Name < chains[j].Name
	})
	sort.SliceStable(sets, func(i, j int) bool { return sets[i].Name < sets[j].Name })

	// Every name is checked before anything is written: a name that is
	// not a plain identifier could end the script's syntax early.
	if err := CheckName("table", table); err != nil {
		return err
	}
	for _, c := range chains {
		if err := CheckName("chain", c.Name); err != nil {
			return err
		}
	}
	for _, s := range sets {
		if err := CheckName("set", s.Name); err != nil {
			return err
		}
	}
	for _, ft := range flowtables {
		if err := CheckName("flowtable", ft.Name); err != nil {
			return err
		}
		for _, d := range ft.Devices {
			if err := CheckDevice(d); err != nil {
				return err
			}
		}
	}
	for _, es := range elems {
		for _, e := range es {
			if e.Verdict.Chain != "" {
				if err := CheckName("chain", e.Verdict.Chain); err != nil {
					return err
				}
			}
		}
	}

	ew := &errWriter{w: w}
	ew.printf("table %s %s {\n", f, table)
	for _, s := range sets {
		ew.printf("\t%s %s {\n\t\t%s\n", map[bool]string{true: "map", false: "set"}[s.Map], s.Name, setType(f, s))
		if s.Timeout > 0 {
			ew.printf("\t\tflags dynamic,timeout\n\t\ttimeout %s\n", timeoutText(s.Timeout))
		}
		if s.Size > 0 {
			ew.printf("\t\tsize %d\n", s.Size)
		}
		if s.Counter {
			ew.printf("\t\tcounter\n")
		}
		if es := elems[s.Name]; len(es) > 0 {
			// In the order of their text, each key formatted once.
			keyed := make([]keyedElement, len(es))
			for i, e := range es {
				keyed[i] = keyedElement{e.Key.String(), e}
			}
			slices.SortFunc(keyed, func(a, b keyedElement) int { return strings.Compare(a.text, b.text) })
			ew.printf("\t\telements = {")
			for i, ke := range keyed {
				e := ke.Element
				sep := ","
				if i == len(es)-1 {
					sep = " }"
				}
				if s.Shape == KeyAddrPair {
					ew.printf("\n\t\t\t%s . %s%s", e.Key, e.Key, sep)
				} else if e.To.IsValid() {
					ew.printf("\n\t\t\t%s : %s . %d%s", e.Key, e.To.Addr(), e.To.Port(), sep)
				} else if e.Verdict.Kind == 0 {
					ew.printf("\n\t\t\t%s%s", e.Key, sep)
				} else {
					ew.printf("\n\t\t\t%s : %s%s", e.Key, e.Verdict, sep)
				}
			}
			ew.printf("\n")
		}
		ew.printf("\t}\n\n")
	}
	for _, ft := range flowtables {
		ew.printf("\tflowtable %s {\n\t\thook ingress priority %d\n\t\tdevices = { ", ft.Name, ft.Priority)
		for i, d := range ft.Devices {
			if i > 0 {
				ew.printf(", ")
			}
			ew.printf("%q", d)
		}
		ew.printf(" }\n")
		if ft.Counter {
			ew.printf("\t\tcounter\n")
		}
		ew.printf("\t}\n\n")
	}
	for i, c := range chains {
		ew.printf("\tchain %s {\n", c.Name)
		if h := c.Hook; h != nil {
			ew.printf("\t\ttype %s hook %s priority %d; policy accept;\n", h.Type, h.Hook, h.Priority)
		}
		for _, r := range c.Rules {
			ew.printf("\t\t%s\n", r.Text(f))
		}
		ew.printf("\t}\n")
		if i < len(chains)-1 {
			ew.printf("\n")
		}
	}
	ew.printf("}\n")
	return ew.err
}

// CheckName accepts a name that nft reads as one identifier and the kernel
// takes: a letter, then letters, digits, '/', '_', '.' and '-', at most
// maxNameLen bytes. Nothing else can appear in a script nftgate writes.
func CheckName(kind, name string) error {
	ok := len(name) > 0 && len(name) <= maxNameLen && isLetter(name[0])
	for i := 1; ok && i < len(name); i++ {
		c := name[i]
		ok = isLetter(c) || c >= '0' && c <= '9' || c == '/' || c == '_' || c == '.' || c == '-'
	}
	if !ok {
		return fmt.Errorf("%s name %q is not an nft identifier (a letter, then letters, digits, '/', '_', '.' or '-', at most %d bytes)", kind, name, maxNameLen)
	}
	return nil
}

// CheckDevice accepts a network interface name as the kernel does
// (dev_valid_name: 1 to 15 bytes, not "." or "..", no '/', ':' or white
// space) that is also a plain string in an nft script (no quote, no
// control character).
func CheckDevice(name string) error {
	ok := len(name) > 0 && len(name) < 16 && name != "." && name != ".."
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c > ' ' && c < 0x7f && c != '/' && c != ':' && c != '"' && c != '\\'
	}
	if !ok {
		return fmt.Errorf("%q is not a network interface name (1 to 15 printable bytes without '/', ':', quotes or spaces)", name)
	}
	return nil
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

type keyedElement struct {
	text string
	Element
}

func setType(f Family, s *Set) string {
	if s.Shape == KeySlot && s.Addresses {
		return "typeof numgen inc mod 2 : " + f.String() + " saddr"
	}
	if s.Shape == KeySlot {
		// A 32-bit integer in host byte order, as jhash writes it. nft
		// takes no "type integer" in a map, and of the expressions with
		// that type which "typeof" names, numgen is one it lists back;
		// no numgen expression is used.
		return "typeof numgen inc mod 2 : verdict"
	}
	addr := "ipv4_addr"
	if f == IPv6 {
		addr = "ipv6_addr"
	}
	switch {
	case s.Shape == KeyProto:
		return "type inet_proto"
	case s.Shape == KeyTraffic:
		return "type " + addr + " . inet_proto . inet_service . " + addr + " . inet_service"
	case s.Shape == KeyAddrPair:
		return "type " + addr + " . " + addr
	case !s.Map:
		return "type " + addr
	case s.Endpoints && s.Shape == KeyProtoPort:
		return "type inet_proto . inet_service : " + addr + " . inet_service"
	case s.Endpoints:
		return "type " + addr + " . inet_proto . inet_service : " + addr + " . inet_service"
	case s.Shape == KeyProtoPort:
		return "type inet_proto . inet_service : verdict"
	}
	return "type " + addr + " . inet_proto . inet_service : verdict"
}

// DurationText writes a duration as nft does, in whole seconds.
func DurationText(d time.Duration) string {
	return fmt.Sprintf("%ds", int64(d/time.Second))
}

// timeoutText writes a set's timeout: in whole seconds (DurationText), or
// in milliseconds where it is not.
func timeoutText(d time.Duration) string {
	if d%time.Second == 0 {
		return DurationText(d)
	}
	return fmt.Sprintf("%dms", d.Milliseconds())
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}

// WriteTables writes family f's tables, as Layout lays them out, as one nft
// script.
func WriteTables(w io.Writer, f Family, tables []Table) error {
	for i := range tables {
		if i > 0 {
			if _, err := io.WriteString(w, "\n"); err != nil {
				return err
			}
		}
		if err := WriteText(w, tables[i].Name, f, &tables[i].Fragment); err != nil {
			return err
		}
	}
	return nil
}
