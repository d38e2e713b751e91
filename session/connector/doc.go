// Package connector is what an engine embeds to share encoder-cache entries
// with vLLM's EC connector (protocol version 2) and Go peers: [Pool] fetches
// entries for a consumer, [Producer] serves them from a cache, over a
// transport control plane and a data plane (transport.TCPData, or nixl).
//
// A fetch asks a producer for an entry by mm_hash and READs its blocks; if it
// fails, the engine encodes the entry itself. Both run in the engine's step
// loop under the rules on [Pool] and [Producer]; ExamplePool, ExampleProducer
// and ExampleProducer_Serve show the loops. Defaults, limits and failure causes
// are in docs/operations.md in the repository.
package connector
