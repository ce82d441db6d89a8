package ids

import (
	"strings"
	"testing"
)

func TestNew(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		id := New("tok")
		if !strings.HasPrefix(id, "tok_") || len(id) != 20 || !IsEncoded(id[4:]) {
			t.Fatalf("bad id %q", id)
		}
		if seen[id] {
			t.Fatalf("duplicate id %q", id)
		}
		seen[id] = true
	}
	if IsEncoded("") || IsEncoded("ABC") || IsEncoded("a_b") {
		t.Error("IsEncoded accepts outside the alphabet")
	}
}
