package idempotency

import (
	"slices"
	"testing"
)

// TestFirsts: a batch holds each row's first call, in arrival order; the
// later calls for a row wait behind that first one, in their order.
func TestFirsts(t *testing.T) {
	same := func(a, b string) bool { return a[0] == b[0] }
	batch, rest := firsts([]string{"a1", "b1", "a2", "c1", "a3", "b2"}, same)
	if want := []string{"a1", "b1", "c1"}; !slices.Equal(batch, want) {
		t.Fatalf("batch %q, want %q", batch, want)
	}
	if len(rest) < len(batch) || !slices.Equal(rest[0], []string{"a2", "a3"}) || !slices.Equal(rest[1], []string{"b2"}) || rest[2] != nil {
		t.Fatalf("rest %q, want [[a2 a3] [b2] []]", rest)
	}
	batch, rest = firsts([]string{"a1", "b1"}, same)
	if len(batch) != 2 || rest != nil {
		t.Fatalf("no duplicates: batch %q rest %q, want both calls and no rest", batch, rest)
	}
}
