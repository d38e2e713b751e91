// Package session holds the EC transfer protocol's two ends as sans-I/O
// state machines: [ConsumerSession], a consumer's side of one producer, and
// [ProducerSession], a producer's side of all its consumers. Most engines use
// package session/connector, which drives them over the network; use these
// over I/O of your own, or on a fake clock in tests (see the package
// Example). They start no goroutines, never read the clock and never sleep.
//
// Call each session's Poll once per engine step with the current time;
// deadlines count from it. Neither session is safe for concurrent use. A
// transfer ends once, in [Results].Completed or Failed; a failure with
// [Outcome].BlocksHeld keeps its blocks, which a READ may still write, until
// they come back in Released. Use one ConsumerSession per control-plane
// connection, and a new one after PeerDown. What a peer sends wrong is
// counted in Stats, never returned. Design notes: docs/design.md in the
// repository.
package session
