package source

import (
	"bufio"
	"bytes"
	"io"
	"math/rand/v2"
	"slices"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// splitWith returns the documents a stream splits into, ending with
// "error: ..." when the split fails.
func splitWith(next func() ([]byte, error, bool)) []string {
	var out []string
	for {
		doc, err, ok := next()
		if !ok {
			return out
		}
		if err != nil {
			return append(out, "error: "+err.Error())
		}
		out = append(out, string(doc))
	}
}

// TestYAMLDocumentsSplitAsYAMLReader: streams of separators (bare, with
// white space, a comment, or other text after them), CRLF line ends,
// blank and comment lines, empty documents and no final newline split into
// the same documents, and fail with the same error, as with
// apimachinery's YAMLReader, which yamlDocuments replaces.
func TestYAMLDocumentsSplitAsYAMLReader(t *testing.T) {
	pieces := []string{"---\n", "---", "--- \t\r\n", "---\r\n", "--- # a comment\n", "----\n", " ---\n", "---x\n",
		"a: 1\n", "b: [1, 2]\r\n", "\n", "  \n", "\r", "# only a comment\n", "{\"kind\": \"Service\"}", "x: ---\n", "c: 3"}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20_000 {
		var b bytes.Buffer
		for range rng.IntN(12) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		data := b.Bytes()
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		want := splitWith(func() ([]byte, error, bool) {
			doc, err := r.Read()
			return doc, err, err != io.EOF
		})
		next, stop := iterPull(yamlDocuments(data))
		got := splitWith(next)
		stop()
		if !slices.Equal(got, want) {
			t.Fatalf("stream %d %q:\nsplit into %q\nwant       %q", i, data, got, want)
		}
	}
}

// iterPull adapts a sequence of documents to splitWith.
func iterPull(seq func(func([]byte, error) bool)) (func() ([]byte, error, bool), func()) {
	type item struct {
		doc []byte
		err error
	}
	var items []item
	seq(func(doc []byte, err error) bool {
		items = append(items, item{doc, err})
		return true
	})
	return func() ([]byte, error, bool) {
		if len(items) == 0 {
			return nil, nil, false
		}
		it := items[0]
		items = items[1:]
		return it.doc, it.err, true
	}, func() {}
}
