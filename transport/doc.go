// Package transport holds the two networks the protocol runs over: the
// ZeroMQ control plane ([Server], the producer's ROUTER; [Client], one
// DEALER per producer) and the pure-Go TCP data plane ([TCPData]). The
// control plane moves bytes and never decodes a message. Package
// session/connector drives both; the README shows the loops, and
// ExampleTCPData the data plane alone.
//
// # Control plane
//
// It speaks ZMTP to Go and libzmq peers alike, at addresses written
// tcp://host:port, over github.com/go-zeromq/zmq4 behind a guard that caps
// frame sizes, checks handshakes and pings silent peers: whatever a peer
// sends wrong closes that one connection. Send, Reply, Drain and Dead never
// block: queues are bounded and refuse with xfer.ErrQueueFull. A Client
// connects on the first Send to a producer ([Client.Connect] does it
// ahead, at an engine's start-up). A producer is reported dead when its
// connection closes, when it stays silent for the peer timeout, or when
// the connect or the handshake times out; the next Send dials anew, with a
// fresh identity. A Server routes replies by the consumer's identity; a
// reply to an identity no connection holds fails with xfer.ErrPeerDown.
// A Server holds at most ServerConfig.MaxConns connections (4,096), and
// MaxConnsPerHost (256) from one host: past either, the one longest
// without a request is closed.
//
// # Data plane
//
// TCPData moves a READ's bytes from the producer's region straight into
// the consumer's blocks. It serves a READ only under a live grant of the
// producer session attached to it (and TCPConfig.Authorize, if set);
// malformed frames, oversized lengths, out-of-range blocks and stalls
// close that connection only. A READ fails when no byte of it moved for
// TCPConfig.IOTimeout. On one Linux host a consumer copies the blocks out
// of a producer's region made with cache.RegionConfig.Shared, once the
// producer proved the region its own; across hosts a producer pushes a
// small entry with its ack (TCPConfig.NoPush turns pushes off). Close
// returns once every goroutine of the package has stopped.
//
// The design, and why (the guard, reading off Go's poller, the READ state
// machine, the same-host proof, pushes): docs/design.md in the repository.
package transport
