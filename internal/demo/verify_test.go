package demo

import "testing"

// A block verifies only with its own item's and index's content, and one
// changed byte fails it.
func TestExpectedSums(t *testing.T) {
	cfg := Config{Items: 5, BlocksPerItem: 3, BlockSize: 4096}
	s := expected(cfg)
	if expected(cfg) != s {
		t.Fatal("the table is computed again for the same shape")
	}
	b := make([]byte, cfg.BlockSize)
	for i := range cfg.Items {
		for j := range cfg.BlocksPerItem {
			Fill(b, i, j)
			if !s.ok(b, i, j) {
				t.Fatalf("item %d block %d: its own content refused", i, j)
			}
			if s.ok(b, (i+1)%cfg.Items, j) || s.ok(b, i, (j+1)%cfg.BlocksPerItem) {
				t.Fatalf("item %d block %d: verified as another block", i, j)
			}
			b[(i*131+j*17)%len(b)] ^= 1
			if s.ok(b, i, j) {
				t.Fatalf("item %d block %d: a flipped bit verified", i, j)
			}
		}
	}
	if s.ok(b[:100], 0, 0) {
		t.Fatal("a short block verified")
	}
}
