package appliance

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	l, err := NewLogger("WARN", "json", &buf)
	if err != nil {
		t.Fatal(err)
	}
	l.Info("hidden")
	l.Warn("shown", "k", 1)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("not one JSON record: %q: %v", buf.String(), err)
	}
	if rec["msg"] != "shown" || rec["level"] != "WARN" || rec["k"] != 1.0 {
		t.Errorf("record = %v", rec)
	}

	buf.Reset()
	l, err = NewLogger("debug", "text", &buf)
	if err != nil {
		t.Fatal(err)
	}
	l.Debug("dbg", "table", "inet nftgate")
	if !strings.Contains(buf.String(), `level=DEBUG msg=dbg table="inet nftgate"`) {
		t.Errorf("text output = %q", buf.String())
	}

	for _, c := range []struct{ level, format, want string }{
		{"verbose", "text", `log level "verbose": want one of debug, info, warn, error`},
		{"info", "xml", `log format "xml": want one of text, json`},
		{"", "text", `log level ""`},
	} {
		if _, err := NewLogger(c.level, c.format, &buf); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewLogger(%q, %q) = %v, want %q", c.level, c.format, err, c.want)
		}
	}
}
