// Package session holds the two ends of the EC transfer protocol as
// deterministic state machines: [ConsumerSession], a consumer's side of one
// producer, and [ProducerSession], a producer's side of all its consumers.
// Most engines use package session/connector, which drives them over the
// network; use these directly to run the protocol over I/O of your own, or
// to test an integration on a fake clock (the package example does).
//
// The sessions are sans-I/O: payloads and the caller's now go in
// ([ConsumerSession.StartXfer], Poll, PeerDown), payloads go out through a
// [Sender] or a [Replier], and outcomes come out of
// [ConsumerSession.TakeResults]. They start no goroutines, never read the
// clock and never sleep: call Poll once per engine step, with the time;
// every deadline is counted from the now passed in. Neither is safe for
// concurrent use. What a peer sends wrong is counted in Stats and logged,
// never returned.
//
// A transfer ends exactly once, in [Results].Completed (its blocks hold the
// entry) or Failed (they do not: encode it locally; [Outcome].Retry says
// another attempt may succeed). A failure with BlocksHeld means a READ may
// still write into its blocks: do not reuse them until they come back,
// once, in Released (Forced there: given up at the quarantine deadline,
// never confirmed stopped).
//
// A control plane of your own must never hand a reply read off one
// connection to the session of another: one ConsumerSession per
// connection, and a new one after PeerDown. A vLLM producer's NACK names
// neither session nor request, so a late one would be taken for the answer
// to the new session's request.
//
// The design, and why (how replies are matched to requests, grants and
// their tokens, where the sessions differ from vLLM's reference):
// docs/design.md in the repository.
package session
