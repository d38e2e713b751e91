// Package session holds the protocol's two ends as sans-I/O state machines:
// [ConsumerSession], a consumer's side of one producer, and
// [ProducerSession], a producer's side of all its consumers. Most engines
// use package session/connector, which drives them over the network; use
// these over your own I/O or a fake clock (see the package Example). Call
// Poll once per engine step with the current time; neither session is safe
// for concurrent use. What a peer sends wrong is counted in Stats, never
// returned. Design notes: docs/design.md.
package session
