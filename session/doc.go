// Package session holds the two ends of the EC transfer protocol as
// deterministic, sans-I/O state machines: [ConsumerSession], a consumer's
// side of one producer, and [ProducerSession], a producer's side of all its
// consumers. Most engines use package session/connector, which drives them
// over the network; use these over I/O of your own, or to test an integration
// on a fake clock (the package example does). They start no goroutines, never
// read the clock and never sleep:
//
//	cons.StartXfer(mmHash, blocks, now.Add(2*time.Second), now)
//	for cons.InFlight() > 0 { // once per engine step
//		prod.Poll(requests, replier, now)
//		cons.Poll(replies, now)
//		cons.TakeResults(&r) // r.Completed, r.Failed, r.Released
//	}
//
// The caller's rules:
//
//   - Call Poll once per engine step with the current time; deadlines count
//     from it. Neither session is safe for concurrent use.
//   - A transfer ends once, in Results.Completed (its blocks hold the entry)
//     or Failed (encode it locally; Outcome.Retry says asking again may
//     succeed).
//   - A failure with BlocksHeld keeps its blocks, which a READ may still
//     write: reuse them only once they come back, once, in Released.
//   - Use one ConsumerSession per control-plane connection, and a new one
//     after PeerDown.
//
// What a peer sends wrong is counted in Stats, never returned. Design notes:
// docs/design.md.
package session
