// Package connector is what an engine embeds to share encoder-cache entries
// with vLLM's EC connector (protocol version 2) and with other Go peers:
// [Pool] fetches entries for a consumer, [Producer] serves them from a
// producer's cache. They run over the ZeroMQ control plane (package
// transport) and a data plane (transport.TCPData between Go peers, or package
// nixl, which vLLM speaks).
//
// A consumer asks a producer for an entry by its content hash (mm_hash); the
// producer pins it and answers with its blocks, or a NACK; the consumer READs
// the blocks into its own, and the producer unpins when the READ is done or
// its pin lease runs out. NACK_NOT_READY is retried with backoff; any other
// NACK is final, and the engine encodes the entry itself.
//
// Both sides run in the engine's step loop, and Step never blocks. A
// consumer's loop:
//
//	pool.FetchEntry(addr, mmHash, size, deadline, time.Now())
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
// The rules an engine must follow are on [Pool] and [Producer]; the runnable
// examples (ExamplePool, ExampleProducer, ExampleProducer_Serve) show both
// loops in full. Log records at Info and above are limited to 5 per message
// per 10 s; Stats counts everything. Design notes: docs/design.md.
package connector
