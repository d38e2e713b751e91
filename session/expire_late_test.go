package session

import (
	"testing"
	"time"
)

// A grant the consumer will not READ is given back at once. The OK ack of
// a vLLM producer (it names no grant) to a request that carried a session
// id of its own, coming after that request was forgotten at its ack
// deadline, is such a grant: its notification "<own id>:<mm_hash>" can
// end that grant alone, since no other request shares the id. Without it
// the entry stays pinned at the producer for the whole lease.
func TestLateOwnIDAckIsGivenBack(t *testing.T) {
	co := newConsumer(t)
	// A READ under a vLLM ack: from now on requests carry ids of their own.
	mustStart(t, co.c, "A", []int{1}, at(time.Second))
	if r := co.poll(t0, co.ok("A", 3)); len(co.data.Posts()) != 1 || len(r.Completed) != 1 {
		t.Fatalf("no READ completed: %+v", r)
	}
	mustStart(t, co.c, "H", []int{2}, at(2*time.Second))
	sid := sidOf(co.out.msgs, "H")
	if sid == co.c.id {
		t.Fatal("the request carried the session's id")
	}
	if r := co.poll(at(2*time.Second + time.Millisecond)); len(r.retryable()) != 1 {
		t.Fatalf("%+v", r)
	}
	if co.c.unanswered() != 0 {
		t.Fatalf("%d unanswered: the record was kept", co.c.unanswered())
	}
	late := ackOK("H", sid, co.prod.AgentMetadata(), 5)
	co.poll(at(3*time.Second), late)
	if st := co.c.Stats(); st.Unread != 1 || co.data.Notifies() != 1 {
		t.Fatalf("the late grant of the forgotten request was not given back: unread %d, notifies %d, foreign %d, stray %d",
			st.Unread, co.data.Notifies(), st.ForeignAcks, st.StrayAcks)
	}
}
