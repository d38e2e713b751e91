// Package transport holds the two networks the protocol runs over: the
// ZeroMQ control plane (Server: the producer's ROUTER; Client: one DEALER
// per producer) and the pure-Go TCP data plane (TCPData). The control plane
// moves bytes and never decodes a message.
//
// # Control plane
//
// It is built on github.com/go-zeromq/zmq4 v0.17.0 behind a guard: a zmq4
// transport of our own whose net.Conn sees every byte. Users still write
// tcp://host:port. The guard fixes what zmq4 gets wrong on the byte stream:
// frame and message sizes are capped before zmq4 reads a size (a declared
// 2^62-byte frame closes one connection instead of the process); READY
// metadata is checked before zmq4 parses it (zmq4 panics on malformed
// properties); every PING is answered with a PONG, no command reaches the
// application, and the guard sends its own PINGs and closes a connection
// whose peer stays silent; a write deadline cuts off a consumer that stops
// reading; server handshakes run off zmq4's serial accept loop with a
// deadline, and a full table of pending handshakes evicts its oldest entry.
//
// Send, Reply, Drain and Dead never block: queues are bounded and refuse
// with xfer.ErrQueueFull. A Client connects on the first Send to a producer;
// Connect, which waits, does it ahead (an engine's start-up). A producer is reported dead when its connection
// closes, when it stays silent for the peer timeout (hung, SIGSTOPped, cut
// off), or when the connect or the handshake times out (nothing answers);
// its DEALER is dropped and the next Send builds a new one with a fresh
// identity, so a libzmq ROUTER never black-holes the reconnection.
//
// After the handshake, which zmq4 runs, the guard carries the messages
// itself: it reads whole messages on the connection's reader goroutine and
// hands them to Drain, and Send and Reply write on the caller's goroutine
// when the socket has room (a write that would wait goes to that
// connection's own writer, under the write deadline). A round trip thus
// crosses two goroutine hand-offs instead of eight, and a consumer that
// stops reading delays no reply to anyone else.
//
// While its owner steps (Drain every step, no Wait), a connection that
// carries messages is read by Drain itself, without waiting, and its
// descriptor leaves Go's network poller: a descriptor the poller watches
// wakes a sleeping thread when bytes arrive, whether or not a goroutine
// waits on it, and on a small host each such wake-up costs more CPU than
// the library's own work for a fetch. The descriptor is duplicated and its
// net.TCPConn closed; Drain reads the duplicate; the first read or write
// that must wait (a reply larger than the socket takes, the goroutine
// reading again) wraps it again. Waiting, Serve, or 20 ms without a
// Drain hands every connection back to its goroutine; messages keep their
// order across the hand-offs. A Drain reads at most 32 connections, each
// up to 64 KiB, and one idle for 1,024 Drains goes back to its goroutine.
// An owner whose Drains are more than 5 ms apart is read by the goroutines
// as a waiting one is.
//
// Replies are routed by the
// consumer's Identity property, or by one the server makes up when it sent
// none. A second connection presenting an identity in use takes it over
// and the first is closed (libzmq's ROUTER_HANDOVER), so a reconnecting
// consumer is never black-holed; a reply to an identity no connection
// holds fails with xfer.ErrPeerDown (zmq4 and libzmq drop it silently), which
// ends its grant at once.
//
// # Data plane
//
// TCPData moves a READ's bytes from the producer's region with writev and
// lands them straight in the consumer's blocks. It serves a READ only when
// the producer session attached to it grants it (a session attaches as it
// starts and detaches as it closes, taking with it everything it
// installed: its gate, its grants on the board, its consumers'
// connections, its notification hook), and TCPConfig.Authorize too if
// set. Grants are capabilities: a Go consumer's READ carries the grant's
// token (from the ack's ecx_token) in its notification, and the session
// checks it; the agent name a connection gives is a label. The
// notification reaches the producer only after the consumer confirms
// every byte landed. A READ served on a connection that closes before
// that confirmation needs its grant no more: it failed on the consumer,
// or every byte had landed already (a consumer keeps a READ's answer only
// once its confirmation is written, a pushed one once the push is in).
// The plane hands its notification to the session whose gate granted it,
// which ends its grant at once instead of at
// its lease. A connection that brings notifications alone (the same-host
// copy's, and pushes') is read by DrainNotifs itself while the producer
// steps, as the control plane's are by Drain. Malformed frames, oversized lengths, out-of-range
// blocks and stalls close that connection only.
//
// Several sessions may be attached to one TCPData at once (at most 4; a
// fifth detaches the oldest), one draining while its successor grants:
// every READ, its notification, its broken-READ report and every push
// belong to the session whose gate authorized the grant, until it
// detaches. The newest is asked first and alone shows grants on the
// board; a notification with no READ (a same-host copy's, a push's, a
// grant given back) goes to the session whose gate holds its grant live,
// and each session takes its own from its attachment, not DrainNotifs,
// which hands out every one queued. A push is written within its grant's
// lease and a second, as an answer is (TCPStats.PushesCut); each
// session's list of broken READs holds 65536, past which their grants end
// at their leases (TCPStats.BrokenLost). Producers are told apart
// by name, address and incarnation. The agent metadata is a msgpack map:
// {"v": 2, "name", "addr", "inc" (a new incarnation id on every start),
// "bs" (block size), "n" (block count), "push" (it pushes to consumers
// that ask), and for the same-host path "shm", "shmoff" and "gt" (the
// grant table's slots)}.
//
// A READ on the consumer side is a small state machine; the table is all
// there is to who may change it:
//
//	state     entered by                     left by                          to
//	queued    PostRead                       the link that writes its frame   sent
//	                                         its one lander                   writing
//	                                         Release                          released
//	                                         its peer or link failing         failed
//	sent      the link that wrote its frame  its link's reader, at its answer writing
//	                                         (or at its push, which came first)
//	                                         Release                          released
//	                                         its link failing                 failed
//	writing   its lander                     its lander, and no one else      done, failed
//
// A lander is whatever moves bytes into the READ's blocks: its link's
// reader (the answer's bytes, or a push that came on that link before the
// answer), a copy out of a same-host producer's region under a grant its
// board shows live, or a push kept for it. Exactly one of them moves
// a READ into writing. Release of a READ in writing closes the connection
// its lander reads from, if it reads from one (every socket lander names
// its connection on the READ before it claims it: an answer's, or a
// push's that came before the READ's frame went), so it stops, and waits
// for the lander: nothing writes into its blocks once Release returns, and
// Release never waits on the network.
//
// Deadlines count progress, the same on both sides: a READ fails when no
// byte of it moved for IOTimeout, its clock starting when it reached the
// head of its connection's queue (the answer ahead of it, or the push that landed the READ ahead of it), and the
// producer's writes follow the same rule.
//
// Sockets, of both planes, are read and written with raw system calls
// through the connection's RawConn (the runtime's poller waits for
// readiness, under the deadlines): an ordinary call that finds the process
// idle wakes the runtime's monitor thread, which then sleeps in 20 µs
// steps until the process idles again, a few thread switches per fetch on
// each side. Race-detector builds make the same calls and tell the
// detector which bytes the kernel moves and what it orders, so the path
// the detector checks is the production one.
//
// # Same host
//
// When the producer's region is cache.RegionConfig.Shared (a sealed memfd),
// its metadata names the file (/proc/<pid>/fd/<n>), and its header holds a
// random token and a table of the live grants, which the producer session
// writes before each ack leaves and clears before the grant's pin goes. A
// consumer that can open the file (same host, same user, same PID
// namespace) maps it read-only and sends a random challenge in its hello;
// only once the producer's welcome answers it with HMAC-SHA256(token,
// challenge, address, incarnation) does the consumer copy, without a READ
// frame, the blocks of a READ whose grant the table shows live, and then
// check the table again: grants only end and grant ids never repeat in a
// process, so a grant still shown was live throughout and the bytes are the
// entry's; a grant gone fails that READ only. It then sends the
// notification, with the grant's token. Nothing is revealed to a producer
// that cannot prove the region is its own: metadata from another host
// naming a local producer's file gets a random challenge, and TCP. The
// check relies on loads not passing older loads, so it is used on amd64
// only; elsewhere READs go over the socket. A lone small READ is copied on
// the caller's goroutine; large ones, and bursts, on the peer's copy
// goroutine; a READ of 2 MiB or more on TCPConfig.CopyWorkers goroutines
// started for it, which leave when it is done: nothing spins or lingers. In
// one process a consumer reads the producer's region through the producer's
// own mapping, whose pages are mapped already, found in a registry of the
// process's Shared regions; that registry is the one thing data planes in a
// process share.
//
// What the proof shows: whoever answers at the address the consumer dialed
// owns the region and is the incarnation the metadata names, so a relay
// elsewhere that passes the challenge on to the owner, or an earlier run's
// metadata, gets TCP. It vouches for no ack: a grant id an ack names is
// copied if the table shows it live. Nor can it stop a process of the
// producer's user on its host, which can open the file (through /proc, not
// in any directory, gone with the producer) and read the token and any
// block, as any agent with a producer's NIXL metadata can.
//
// # Pushes
//
// Between Go peers that share no memory, the READ's round trip is saved
// another way: the producer session hands the data plane each grant of a
// consumer session with at most two grants live, right after its ack, and
// TCPData writes its blocks (up to 1 MiB, and a quarter of what the
// consumer keeps) on a connection of that consumer session, holding the
// grant's pin until they are out of the region. Which connection is the
// consumer's is proven, never claimed: a connection takes pushes for a
// consumer session only once a READ on it presented one of that session's
// grant tokens, and only if its hello offered to keep pushes. The consumer
// keeps a push until a READ with its notification and exactly its blocks
// claims it (a READ posted while its push arrives waits for it). A READ of
// a grant that may be pushed goes on the connection pushes come on: if it
// leaves before its push arrives, the push lands it there, and the
// producer answers it "pushed", so the bytes cross once. PushBuffer < 0
// or NoPush turns them off.
//
// Differences from the reference's transports: bounded queues instead of
// unlimited high-water marks; dead-peer detection for hung and
// never-reachable producers; a maximum frame size; READs gated by grants;
// Close returns only once every goroutine of ours has stopped (zmq4's own
// finish within microseconds: its Close does not wait), and aborts a dial
// or handshake in progress.
package transport
