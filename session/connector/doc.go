// Package connector is what an engine embeds: [Pool] on the consumer side
// and [Producer] on the producer side, over the ZeroMQ control plane
// (package transport) and a data plane (transport.TCPData, or package
// nixl). The messages, their bytes, the framing and the notifications are
// vLLM's EC connector's (protocol version 2), so a Go producer serves vLLM
// consumers and a Go consumer fetches from vLLM producers over NIXL.
//
// A consumer asks a producer for an entry by its content hash (mm_hash);
// the producer pins the entry and answers with its block ids, or a NACK;
// the consumer READs the blocks straight into its own, and the producer
// unpins on the READ's notification or when the pin lease runs out.
// NACK_NOT_READY is worth retrying, and the Pool retries it with backoff;
// every other NACK is final.
//
// Both sides run in the engine's step loop: [Pool.Step] and
// [Producer.Step] never block. A Pool is not safe for concurrent use; a
// Producer may be stepped and served at once ([Producer.Serve] steps it
// for an engine that does not step while idle).
// A fetch ends exactly once, in Completed or Failed, by the deadline given
// to [Pool.Fetch] at the latest, whatever it waits for (a dial, its ack, a
// retry's backoff, a READ). A Failure with BlocksHeld keeps its blocks
// until they come back, once, in a later Released: a READ may still write
// into them. [Pool.FetchEntry] allocates the blocks in the consumer's
// cache.EmbeddingCache and hands the completed entry over held: let it go
// with Unpin, once.
//
// Logs are the reference's, at its levels, except that a message at Info
// or above is let through at most 5 times per 10 s; [Pool.Stats] and
// [Producer.Stats] count every NACK.
//
// The runnable examples (ExamplePool, ExampleProducer,
// ExampleProducer_Serve) show both loops. The design, and why:
// docs/design.md in the repository.
package connector
