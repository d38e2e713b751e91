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
// Results tell the consumer's block allocator what to do: Completed (promote
// the blocks), Tombstoned (free them, do not retry now), Retryable (free
// them, retry allowed), Quarantined (a READ may still write: keep them) and
// Settled (a quarantined READ ended: free them now).
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
//  2. An ack echoing a session id that is not empty and not ours is ignored
//     and counted (ForeignAcks).
//
//  3. StartXfer for an mm_hash already in flight (waiting, reading or in
//     quarantine) returns ErrInFlight instead of overwriting a live
//     transfer whose READ would then never be followed.
//
//  4. Blocks are reported free only when the data plane confirms the READ
//     ended. A failed state check quarantines the transfer instead of
//     failing it. The quarantine deadline still forces a transfer out, but
//     the Settled outcome says Forced when nothing confirmed the READ
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
//  7. An ack that does not decode but names our session and a transfer
//     waiting for its ack (a status we do not know, say) ends that transfer
//     at once as bad-ack; a request that does not decode but names its
//     mm_hash and session is answered NACK_INTERNAL (the reference drops
//     both, and the consumer waits out its ack timeout and retries).
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
//     first agent that sends one for the session. Authorize holds the
//     entry's pin while a data plane serves a READ, past the end of its
//     grant.
//
//  10. One session, and one control-plane identity, pins at most
//     MaxPinnedShare of the cache and holds at most MaxGrantsPerEntry
//     grants of one entry (NACK_NOT_READY beyond either, which consumers
//     retry); requests older than MaxRequestAge are dropped.
//
//  11. The consumer sends connector_version explicitly, its agent name and
//     an attempt number; it ignores an ack that echoes another attempt,
//     and trusts a READ only within the lease the ack advertises
//     (ecx_lease_ms), else within xfer.Config.PinLease.
//
//  12. Cancel ends one transfer; Drain stops a producer granting.
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
//     (ecx_shape_ok: its data plane is an xfer.ShapedPeers) it sends its
//     region's shape in the descriptor's place (ecx_shape, 32 bytes
//     against 14 a block), when the descriptor describes one.
//
// Also: every deadline comes from the caller's now (the reference mixes in
// its own monotonic clock); peer death quarantines READs with a real
// quarantine deadline (in the reference they never settle); a reply the
// control plane refuses releases the grant's pin at once instead of holding
// it for a whole lease; results are slices in event order, reusable across
// steps, and carry the blocks and the reason.
package session
