// Package session holds the two ends of the EC transfer protocol as
// deterministic state machines: [ConsumerSession], a consumer's side of one
// producer, and [ProducerSession], a producer's side of all its consumers.
// Most engines use package session/connector instead, which drives them over
// the network; use these to run the protocol over I/O of your own, or to test
// an integration on a fake clock (the package example does).
//
// The sessions are sans-I/O: they start no goroutines, never read the clock
// and never sleep. Payloads and the time go in, payloads go out through a
// [Sender] or [Replier], outcomes come out of [ConsumerSession.TakeResults]:
//
//	cons.StartXfer(mmHash, blocks, now.Add(2*time.Second), now)
//	for cons.InFlight() > 0 { // once per engine step
//		prod.Poll(requests, replier, now)
//		cons.Poll(replies, now)
//		cons.TakeResults(&r) // r.Completed, r.Failed, r.Released
//	}
//
// Rules for the caller:
//
//   - Call Poll once per engine step with the current time; every deadline
//     is counted from it. Neither session is safe for concurrent use.
//   - A transfer ends exactly once, in Results.Completed (its blocks hold
//     the entry) or Failed (encode it locally; Outcome.Retry says asking
//     again may succeed).
//   - A failure with BlocksHeld keeps its blocks: a READ may still write
//     them. Reuse them only once they come back, once, in Released.
//   - Use one ConsumerSession per control-plane connection, and a new one
//     after PeerDown; never hand it a reply read off another connection.
//
// What a peer sends wrong is counted in Stats and logged, never returned.
// Design notes (how replies are matched to requests, grants and tokens, the
// differences from vLLM's reference): docs/design.md.
package session
