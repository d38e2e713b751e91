// Package hooks lets this module's packages, its simulator and tests reach
// inside types whose internals no user should touch: the packages that own
// them set these functions in init.
package hooks

// SessionPins adds the pins a *session.ProducerSession holds for its
// grants, per mm_hash, to dst.
var SessionPins func(s any, dst map[string]int)

// ProducerPins does the same for a *connector.Producer, under its lock.
var ProducerPins func(p any, dst map[string]int)

// OnNotify installs f where a *session.ProducerSession's data plane queues
// completion notifications (plane.Attachment.OnNotify); nil removes it.
// false: the session has no such data plane.
var OnNotify func(s any, f func() bool) bool
