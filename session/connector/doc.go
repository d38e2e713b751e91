// Package connector is what an engine embeds to share encoder-cache entries
// with vLLM's EC connector (protocol version 2) and Go peers: [Pool] fetches
// entries for a consumer, [Producer] serves them from a cache, over a
// transport control plane and a data plane (transport.TCPData, or nixl).
// Both run in the engine's step loop under the rules on [Pool] and
// [Producer], as the examples show. Defaults, limits and failures:
// docs/operations.md.
package connector
