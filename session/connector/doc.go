// Package connector is what an engine embeds to share encoder-cache entries
// with vLLM's EC connector (protocol version 2) and other Go peers: [Pool]
// fetches entries for a consumer, [Producer] serves them from a producer's
// cache, over package transport's control plane and a data plane
// (transport.TCPData, or package nixl, which vLLM speaks).
//
// A fetch asks a producer for an entry by its content hash (mm_hash) and
// READs its blocks; NACK_NOT_READY is retried, any other NACK is final and
// the engine encodes the entry itself. Both sides run in the engine's step
// loop, and Step never blocks:
//
//	if _, err := pool.FetchEntry(addr, mmHash, size, deadline, time.Now()); err != nil {
//		encodeLocally(mmHash) // nothing started
//	}
//	for pool.InFlight() > 0 && pool.Wait(ctx) {
//		r := pool.Step(time.Now())
//		for _, d := range r.Completed {
//			use(d.MMHash)           // the entry is in the cache, held
//			entries.Unpin(d.MMHash) // once, when done with it
//		}
//		for _, f := range r.Failed {
//			encodeLocally(f.MMHash) // f.Err says why
//		}
//	}
//
// The rules an engine must follow are on [Pool] and [Producer]; ExamplePool,
// ExampleProducer and ExampleProducer_Serve show both loops in full. Design
// notes: docs/design.md.
package connector
