// Package connector is what an engine embeds: [Pool] on the consumer side
// and [Producer] on the producer side, over the ZeroMQ control plane and a
// data plane (the pure-Go TCP one, or NIXL).
//
// # The protocol in a screen
//
// A producer (an encoder instance) keeps embeddings, keyed by the content
// hash mm_hash, in a fixed pool of equal-sized blocks of host memory. A
// consumer (a prefill instance) that needs one allocates blocks of its own
// and asks:
//
//	consumer (DEALER)                          producer (ROUTER)
//	  XferReq{mm_hash, compat hash, session id} ──▶
//	                                             check version, compat hash,
//	                                             session id; pin the entry
//	  ◀── XferAck{OK, block ids, agent metadata, mem descriptor}
//	  register the producer's agent (once per metadata blob)
//	  READ remote blocks → local blocks, notification "<session id>:<mm_hash>"
//	  ═════════ one-sided READ on the data plane ═════════
//	                                             notification → unpin
//	                                             (or the 30 s pin lease runs out)
//	  READ done → the blocks hold the embedding
//
// A NACK says why not: MISSING and INCOMPAT, VERSION and INTERNAL are final;
// NOT_READY (the save has not landed) is worth retrying, and the Pool does,
// with backoff, within a budget. Both sides run in the engine's step loop:
// [Pool.Step] and [Producer.Step] never block; [Producer.Serve] is there for
// engines that do not step while idle.
//
// # The deadline is the engine's budget
//
// A fetch ends by the deadline given to [Pool.Fetch], whatever it waits
// for (a dial, its ack, a retry's backoff, a READ): at the first
// [Pool.Step] at or after it, in Failed with reason xfer.DeadlineExceeded,
// or earlier with that reason once no retry fits before it. A producer
// that stays silent past the control plane's peer timeout ends its fetches
// the same way at once (reason peer-down, the cause in Err); one whose
// connection merely closed lets its READs run on. Where a READ may still
// write (NIXL cannot stop one for certain; the TCP plane can), the Failure
// says BlocksHeld and the blocks come back once, in a later Released. A
// grant no READ will use (the ack of an ended fetch, one that does not
// fit, one past its lease) is given back to the producer at once.
//
// # Blocks
//
// [Pool.Fetch] reads into blocks the engine allocated; [Pool.FetchEntry]
// allocates them itself in the consumer's [cache.EmbeddingCache]
// (PoolConfig.Cache): the completed entry is handed over ready and held
// (Done.Held: cache.Unpin when done with it), and every failure gives the
// blocks back. A [Producer] over the same cache serves what was fetched.
// [Pool.Cancel] ends one fetch as the deadline does. [Producer.Shutdown]
// shuts a producer down without pulling blocks from under running READs.
//
// # Mapping onto vLLM
//
// The messages, their msgpack bytes, the ZeroMQ framing and the
// notification text are vLLM's EC connector's (protocol version 2), so a Go
// producer serves vLLM consumers and a Go consumer fetches from vLLM
// producers, given the same data plane: NIXL between vLLM and Go (build tag
// nixl), or the TCP data plane between Go peers.
//
// The logs are the reference's, at its levels, with one difference: a
// message at Info or above is let through at most 5 times per 10 s, then
// once with a count of those suppressed. The reference logs every expected
// NACK (a cache miss) at Info; at thousands of fetches a second that is
// thousands of lines. [Pool.Stats] and [Producer.Stats] count every NACK.
package connector
