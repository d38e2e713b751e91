// Package session holds the two ends of the EC transfer protocol as
// deterministic state machines: [ConsumerSession], one per producer a
// consumer talks to, and [ProducerSession], one per producer. They are
// sans-I/O: bytes and the caller's now go in, bytes and results come out.
// No goroutines, no clock reads, no sleeps: the engine's step loop drives
// them, and tests drive them with a fake clock.
//
// # The protocol in one screen
//
// The consumer allocates local blocks and calls StartXfer, which sends an
// XferReq. The producer's Poll checks the request (version, compatibility
// hash, session id), pins the entry if it is ready and answers an OK XferAck
// with the entry's block ids, its data plane's agent metadata and its mem
// descriptor, or a NACK. The consumer's Poll registers the producer's agent
// (once per metadata blob), posts a one-sided READ of those blocks into its
// own with the notification "<session_id>:<mm_hash>", and follows the READ
// until the data plane says it ended. The producer unpins the entry when that
// notification arrives, or when the pin lease runs out.
//
// Results use connector.Pool's words: a transfer ends once, in Completed
// (the blocks hold the entry) or Failed (they do not); a failure with
// BlocksHeld keeps its blocks until they come back, once, in Released.
// How vLLM's names map onto them:
//
//	vLLM's consumer    here
//	completed          Completed
//	tombstoned         Failed, Retry false (do not ask again now)
//	retryable          Failed, Retry true (another attempt may succeed)
//	quarantined        Failed, BlocksHeld (a READ may still write)
//	settled            Released (Forced: given up at the quarantine deadline)
//
// One difference: a READ the data plane reports failed is Retry here
// (its blocks are free and the entry may still be there, under a new
// grant), where vLLM tombstones it.
//
// # Which request a reply answers
//
// Every message either side handles (an OK ack, a NACK of any status, a
// reply that does not decode, a READ's completion, a notification) is
// matched to one request or grant, or dropped and counted; only a matched
// message acts on a fetch. What follows says how, per message and per kind
// of peer, and what cannot be told apart.
//
// A ConsumerSession is one control-plane connection: it sends through one
// Sender and forgets its unanswered requests at PeerDown. connector.Pool
// keeps it so: transport.Client dials one DEALER per producer address and
// never reconnects it (a broken connection is reported dead and the next
// send dials anew), and the Pool makes a new session, with a new id, for
// an address once its producer is reported dead. On one connection,
// replies come in the order of their requests (ZeroMQ), a reply answers
// a request sent on its own connection only, and none is duplicated.
// Neither producer answers a request twice: vLLM's answers every request
// it can decode, in order; ours the same, except that it drops, never
// answering, a request that its backlog or its control plane refused (one
// that waited too long is answered NACK_NOT_READY).
//
// The consumer session keeps the requests it sent and has not seen
// answered, in the order it sent them. Each names its attempt
// (ecx_attempt), a number no other request of the process carries.
//
//   - A reply echoing another session's id is not ours: dropped
//     (ForeignAcks), answering nothing. A reply echoing the id of one of
//     our requests that carried an id of its own (see below) answers that
//     request or nothing; one echoing the session's id answers only a
//     request that carried the session's.
//   - A reply naming an attempt (a Go producer echoes it in its OK acks
//     and NACKs), whether or not the rest of it decodes, answers that
//     request. An attempt not among ours
//     (answered already, another session's, never sent) answers nothing:
//     dropped (StrayAcks).
//   - A reply naming no attempt (vLLM's producer: its OK ack echoes the
//     session id, its NACK carries mm_hash and status only), decoded or
//     not, answers the oldest unanswered request of its mm_hash.
//   - The requests sent before the one a reply answers, of any mm_hash,
//     are forgotten: the producer answers in order, so it has answered
//     or dropped them.
//   - A reply acts only if the request it answers is the current attempt
//     of a transfer waiting for its ack; any other is dropped
//     (StrayAcks). One that names no mm_hash is dropped (Malformed).
//   - A READ's completion acts on the transfer that posted it: the data
//     plane reports it by handle.
//
// Why the oldest: when a producer answers each request at most once and
// in order, a reply matched this way is matched to its own request or,
// if the producer dropped one, to an earlier one, never to a later one.
// An OK ack's lease is counted from the send time of the request it is
// matched to, so it is never overestimated; a dropped request costs
// liveness, never bytes: the replies of its mm_hash are each taken for
// the request before their own (and dropped, that attempt timing out)
// until a reply of a request sent after them comes and the requests
// before it are forgotten. The alternative, refusing an ack that names no
// attempt while an earlier request is unanswered, comes to the same:
// such an ack is matched to that earlier request.
//
// A producer that names no grant in its OK acks (vLLM's) tells a READ's
// notification by "<session_id>:<mm_hash>" alone: a late notification of
// an earlier grant of a key, arriving after the producer granted the key
// again to the same session, would end the new grant under its READ (and
// vLLM's producer drops the earlier grant's pin at the re-request). So
// once a READ was posted under such an ack, every later request of the
// session carries a session id of its own, a fresh UUID4, which no other
// grant shares: a notification then ends only the grant of the request
// that carried its id. The cost, on such a producer, is that the grant of
// a request the consumer gave up on (its ack came late) keeps its pin
// until its notification or its lease, rather than going at the
// re-request. Go producers name their grants; requests to them keep the
// session's id.
//
// An OK ack that acts posts its READ only if it is handled by the end of
// its grant's lease: the send time of the request it answers plus the
// lease the ack advertises (ecx_lease_ms), else xfer.Config.PinLease.
// Past it, no READ is posted (over NIXL a posted READ cannot be stopped,
// and the producer may have reused the blocks): the transfer fails, Retry,
// with reason late-completion (LateAcks), and connector.Pool asks again,
// for a new grant. A READ seen complete after the same moment fails
// without Retry (LateCompletion).
//
// An OK ack that no READ will use (it does not fit, it came past its
// lease, or its transfer ended before it came: cancelled, or past the
// Pool's deadline) is given back at once: the session sends the grant's
// notification without reading, on a data plane that can
// (transport.TCPData, nixl.Agent), so that the producer unpins now rather
// than at its lease (Unread counts them). A Go producer's notification
// names the grant and its token; one naming "<session_id>:<mm_hash>" alone
// (vLLM's producer) is sent only while no other request or transfer of the
// session carries that name, since it would end that one's grant too.
//
// The unanswered requests are bounded, 16 per mm_hash and 2^20 in all.
// Past either, StartXfer refuses with an xfer.ErrQueueFull (which the
// Pool retries) rather than forget a request: its reply would then be
// matched to a later request.
// They go as they or later requests are answered, at PeerDown, and with
// the session (the Pool closes a session idle for PoolConfig.IdleSession).
//
// On the producer, a notification ends one grant or nothing (counted:
// UnknownNotifs, ForeignNotifs, BadTokens, BadNotifs). A Go consumer's
// names its grant and presents the grant's token ("#<grant>.<token>"):
// it ends that grant and no other, however late; after the grant's lease
// it ends nothing. A vLLM consumer's names none ("<session_id>:<mm_hash>"):
// it ends the oldest live grant of that key. While grant N of a key is
// live, N's notification ends N, even after N+1 was made. Once N's lease
// has run out, N's late notification cannot be told from N+1's own and
// ends N+1; a READ being served under N+1 keeps the entry pinned until it
// is released (on data planes that authorize READs, as the TCP plane), but over
// NIXL the pin goes with the grant, as it does in the reference. The
// notification's agent is checked against the session's: the request's
// ecx_agent, or for a vLLM consumer, which sends none, the agent of the
// first notification of its session. Before that first one, another
// agent's notification naming the session's key cannot be told from the
// consumer's: it ends the oldest grant of the key and binds the session
// to itself, and the consumer's own notifications are then refused
// (ForeignNotifs), its grants ending by lease. After it, another agent's
// is refused.
//
// A data plane that serves READs through the session's gate (the TCP
// plane) also tells it of READs it served that cannot complete: their
// connection closed before the consumer confirmed every byte. Such a
// report ends the grant it names with its token, if it is still live and
// bound to the READ's agent, at the next Poll (BrokenReads), instead of at
// its lease: the consumer, whose READ failed, asks anew for a new grant.
// It is safe to unpin then: the plane wrote every byte of that READ out
// of the region before it saw the connection close (it holds the entry
// while it writes), a consumer that did get them all keeps them whatever
// becomes of the blocks, a push of the grant keeps its own hold until its
// bytes are out, and a same-host copy under the grant sees it retired
// from the board and drops what it copied. A report naming no grant, or
// without its token, ends nothing: a bare key would name the oldest
// grant of the key, maybe not the READ's.
//
// The session relies on its control plane for one thing it cannot check:
// that a reply read off a connection never reaches the session that
// replaced it. transport.Client hands over nothing of a connection once
// Dead has reported it, or Remove dropped it; a control plane of an
// engine's own must do the same, else a vLLM producer's NACK, which names
// neither session nor attempt, could be taken for the answer to the next
// session's request.
//
// # Where this package deliberately differs from the reference
//
//  1. An OK ack is checked before the READ is posted: as many source blocks
//     as local ones, each unique and inside the producer's region. A failed
//     check or a refused post tombstones that transfer only; nothing escapes
//     Poll (the reference lets the post's exception escape the engine loop).
//     A post refused because the data plane no longer knows the producer's
//     agent (xfer.ErrUnknownPeer: a load NIXL made after registering
//     failed) also drops the registration, so the next ack registers the
//     producer again.
//
//  2. Replies are matched to requests as above: an ack echoing a session
//     id that is not ours is ignored (ForeignAcks); one answering an
//     earlier attempt, late or repeated, cannot act on a later one.
//
//  3. StartXfer for an mm_hash already in flight (waiting, reading or in
//     quarantine) returns ErrInFlight instead of overwriting a live
//     transfer whose READ would then never be followed.
//
//  4. Blocks are reported free only when the data plane confirms the READ
//     ended. A failed state check quarantines the transfer instead of
//     failing it. The quarantine deadline still forces a transfer out, but
//     the Released outcome says Forced when nothing confirmed the READ
//     stopped, and it is counted and logged.
//
//  5. A READ first seen complete after request time + pin lease is
//     tombstoned (LateCompletion), not promoted: the producer may have
//     reused the blocks. (Request time, not ack time: the producer's lease
//     started when it granted, between the two.)
//
//  6. Close reports what it abandons: the pending results, the transfers
//     whose blocks may be reused, and those whose READ could not be stopped.
//
//  7. An ack that does not decode but names its mm_hash (a status we do
//     not know, say) answers a request as any reply; if that request's
//     transfer waits for its ack, it ends at once as bad-ack. A request
//     that does not decode but names its mm_hash and session is answered
//     NACK_INTERNAL (the reference drops both, and the consumer waits out
//     its ack timeout and retries).
//
//  8. A re-request of an entry by the same session is a grant of its own;
//     the earlier grant stays until its own READ's notification or its
//     lease ends it (the reference drops the earlier pin, and the earlier
//     READ's notification then ends the new grant under a running READ).
//     A notification naming a grant ("#<grant>", from the ack's ecx_grant)
//     ends exactly that grant; one without ends the oldest of its key.
//
//  9. A grant made for a Go consumer (its request names its attempt) is a
//     capability: the ack carries a 128-bit token (ecx_token) that the
//     consumer puts in its notification ("#<grant>.<token>"), and only a
//     READ or a notification that presents it acts on the grant; a grant
//     id alone, a bare key, or a name do not. Grant ids never repeat
//     across the producer sessions of a process. Grants are also bound to
//     the consumer's agent (the request's ecx_agent, or the first
//     notification of the session): another agent's notification or READ
//     is refused, though a name is a label, never enough by itself. A
//     vLLM consumer sends neither token nor agent; its grants are ended by
//     the reference's notification, "<session_id>:<mm_hash>", from the
//     first agent that sends one for the session. A data plane that
//     authorizes READs (the TCP plane) holds the entry's pin while it
//     serves one, past the end of its grant.
//
//  10. A request is refused for its pins only when its grant would both
//     take its session's, or its control-plane identity's, pinned blocks
//     over MaxPinnedShare of the cache and leave saves less room than the
//     reserve (the larger of SaveReserve and the largest save seen): a
//     consumer within its share is never refused for its pins, and one
//     beyond it never takes the room of the encoder's next save. A session
//     holds at most MaxGrantsPerEntry grants of one entry. Beyond either
//     the answer is NACK_NOT_READY, which consumers retry; requests older
//     than MaxRequestAge are answered NACK_NOT_READY, not granted. The
//     grants that ended by a Poll (notifications, leases) end before it
//     answers requests, so a consumer that let an entry go is not charged
//     for it. A contact request (ecx_contact) is known by its flag alone:
//     it is never looked up in the cache and pins nothing, and an entry
//     that has its mm_hash is an ordinary entry.
//
//  11. The consumer sends connector_version explicitly, its agent name and
//     an attempt number; it posts a READ, and trusts its completion, only
//     within the lease the ack advertises (ecx_lease_ms), else within
//     xfer.Config.PinLease, counted from the request the ack answers.
//
//  12. Cancel ends one transfer; StopGranting stops a producer granting.
//
//  13. A producer attaches to a data plane that serves READs itself (the
//     TCP plane) as it starts, and detaches as it closes: everything it
//     installed there (its gate, its grants on the same-host board, the
//     connections proven to be its consumers', its notification hook) goes
//     with it, so a session that replaces it on the same plane starts
//     clean. It publishes each grant on the board before its ack and
//     retires it before its pin goes, so that a consumer on the same host
//     copies without a READ round trip and keeps the bytes only if the
//     grant outlived the copy. On a data plane that lets any peer READ
//     (NIXL), Close cannot stop a READ under a live grant: it leaves the
//     grants pinned until their notifications or leases, which later
//     Polls see to (the reference unpins every grant at once).
//
//  14. An OK ack carries the mem descriptor only until that consumer
//     session has completed a READ (or the agent metadata changed): the
//     consumer registers the producer once per metadata blob, as the
//     reference's does. To a consumer that offers to take shapes
//     (ecx_shape_ok: its data plane takes shapes, as NIXL does) it sends its
//     region's shape in the descriptor's place (ecx_shape, 32 bytes
//     against 14 a block), when the descriptor describes one.
//
// Also: every deadline comes from the caller's now (the reference mixes in
// its own monotonic clock); at a control connection's death READs run on
// to their end on their data connections, and one that completes is a
// completed fetch (in the reference they are quarantined and never
// settle); a reply the control plane refuses releases the grant's pin at
// once instead of holding it for a whole lease; results are slices in
// event order, reusable across steps, and carry the blocks and the reason.
package session
