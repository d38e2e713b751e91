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
// with ErrQueueFull. A Client connects on the first Send to a producer;
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
// stops reading delays no reply to anyone else. Replies are routed by the
// consumer's Identity property, or by one the server makes up when it sent
// none. A second connection presenting an identity in use takes it over
// and the first is closed (libzmq's ROUTER_HANDOVER), so a reconnecting
// consumer is never black-holed; a reply to an identity no connection
// holds fails with ErrPeerDown (zmq4 and libzmq drop it silently), which
// ends its grant at once.
//
// Both planes read their sockets, and write them except where a READ's
// bytes go out with writev, with raw system calls (the sockets never
// block; the runtime's poller waits for them). The ordinary
// calls wake the runtime's monitor thread on the first call after the
// process idled, and it then polls every 20 µs until the process idles
// again: for a step loop that idles between fetches, a thread wakeup and a
// few timer sleeps per fetch on each side. Removing them took a
// two-process fetch's p99 from about 800 to about 300 µs on two cores.
// Race-detector builds keep the ordinary calls, which tell the detector
// what the kernel orders.
//
// # Data plane
//
// TCPData moves a READ's bytes from the producer's region with writev and
// lands them straight in the consumer's blocks. The producer serves a READ
// only when its Authorizer (ProducerSession.Authorize) finds a live grant
// for the READ's notification covering every block asked for; NIXL lets any
// peer read any registered block. The notification reaches the producer
// only after the consumer confirms every byte landed. Malformed frames,
// oversized lengths, out-of-range blocks and stalls close that connection
// only. Producers are told apart by name, address and incarnation, so two
// producers configured with one name are two peers. Each READ gets
// IOTimeout from when it was sent. Release stops a READ whose bytes are
// landing by closing its connection and waiting for the reader
// (StopsReads). The producer holds the grant (its release func) until the
// READ's bytes have left the region. The agent metadata is a msgpack map: {"v": 1, "name", "addr",
// "inc" (a new incarnation id on every start), "bs" (block size), "n"
// (block count), "push" (it pushes to consumers that ask), and for the
// same-host path "shm", "shmoff" and "gt" (the grant table's slots)}.
//
// # Same host
//
// When the producer's region is cache.RegionConfig.Shared (a memfd), its
// metadata names the file (/proc/<pid>/fd/<n>). A consumer that can open
// it (same host, same user, same PID namespace) and finds its size sealed
// (so that no copy out of the mapping can run past its end) maps it
// read-only and proves it by sending the random token the producer wrote
// in the file's header; the producer then answers a granted READ with "copy" instead of
// the bytes, holds the grant until the consumer's done (at most IOTimeout,
// or until the connection closes), and the consumer copies the blocks
// itself: one memcpy instead of two kernel copies and a socket. Such a
// READ still goes through the Authorizer, and the notification still
// reaches the producer only after the copy. A hold the producer gives up
// before the done (timeout, connection lost) is counted in the header
// before the blocks are released; the consumer compares that count with
// the one sent with the grant after its copy and fails the READ if it
// moved, so torn bytes are never promoted. Any other outcome (no file, a
// wrong token, NoSharedMemory on either side) is the TCP path.
//
// A producer session that claimed the region's grant board
// (xfer.GrantBoard; not offered when TCPConfig.Authorize is set) also
// writes each live grant's id into a table in the header before its ack
// leaves, and clears it before the grant's pin goes. A consumer whose
// READ names a grant ("#<grant>") the table shows live copies at once,
// without a READ frame or an answer, then checks the table again: grants
// only end, so a grant still shown was live throughout and the bytes are
// the entry's; a grant gone fails the READ. It then sends the notification
// (a notify frame, taken only on a connection that proved the token). This
// saves the READ's round trip; it relies on loads not passing older loads,
// so it is used on amd64 only. A lone small READ is copied on the caller's
// goroutine; large ones, and bursts, on the peer's copier goroutine,
// whose notifications go out in one write.
//
// A same-host READ of 2 MiB or more is copied by TCPConfig.CopyWorkers
// goroutines at once (default GOMAXPROCS, at most 4), taking 512 KiB at a
// time: one core copies well under what the memory bus carries, and both
// processes wait on the copy. In one process a consumer reads
// the producer's region through the producer's own mapping
// (cache.BorrowShared), whose pages are mapped already.
//
// # Pushes
//
// Between Go peers that share no memory, the READ's round trip is saved
// another way: a producer session (xfer.Pusher) hands the data plane each
// grant of a consumer session with at most two grants live, right after
// its ack, and TCPData writes the blocks on the consumer's first data
// connection (which a consumer's READs bring up before any other) without
// waiting to be asked (entries up to 1 MiB and a
// quarter of the consumer's TCPConfig.PushBuffer, while nothing else is
// being written there), holding the grant's pin until they are out of the
// region. The consumer keeps them until a READ with that grant's
// notification (session, mm_hash and grant) and exactly those blocks
// claims them; a READ that arrives while they do
// waits for them, and one that went out before them is landed by them and
// answered "pushed" by the producer, so the bytes cross once. Unclaimed
// pushes are evicted oldest first, and a READ of an evicted one asks for
// the bytes again. A consumer asks for pushes with a stage frame, only
// from a producer whose metadata says "push", so older peers on either
// side never see one. PushBuffer < 0 or NoPush turns them off.
//
// What it trusts: a process of the producer's user on its host can open
// the file and read any block, granted or not (as any agent with a
// producer's NIXL metadata can). The file is not in any directory, is
// opened through /proc (which the kernel limits to the same user, or
// root), and dies with the producer.
//
// Differences from the reference's transports: bounded queues instead of
// unlimited high-water marks; dead-peer detection for hung and
// never-reachable producers; a maximum frame size; READs gated by grants;
// Close returns only once every goroutine of ours has stopped (zmq4's own
// finish within microseconds: its Close does not wait), and aborts a dial
// or handshake in progress.
package transport
