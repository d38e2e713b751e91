package session

import (
	"fmt"
	"testing"
)

// The forgotten requests are bounded (maxForgotten), by attempt and by own
// id alike, and the oldest go first; each is taken once.
func TestForgottenRequestsBounded(t *testing.T) {
	var f forgotten
	n := maxForgotten + 1000
	for i := 1; i <= n; i++ {
		sid := ""
		if i%2 == 0 {
			sid = fmt.Sprint("own-", i)
		}
		f.add(uint64(i), sid)
	}
	if len(f.order) != maxForgotten || len(f.attempts) != maxForgotten || len(f.sids) != maxForgotten/2 {
		t.Fatalf("order %d attempts %d sids %d", len(f.order), len(f.attempts), len(f.sids))
	}
	if f.take(1, "") || f.take(0, "own-2") {
		t.Fatal("the oldest were kept")
	}
	if !f.take(0, fmt.Sprint("own-", n)) || f.take(uint64(n), "") {
		t.Fatal("the newest, by own id, not taken once")
	}
	if !f.take(uint64(n-1), "") || f.take(uint64(n-1), "") {
		t.Fatal("by attempt, not taken once")
	}
	if f.take(0, "") {
		t.Fatal("an empty id matched")
	}
}
