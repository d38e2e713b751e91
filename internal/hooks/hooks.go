// Package hooks lets this module's simulator and tests look inside types
// whose internals no user should touch: the packages that own them set
// these functions in init.
package hooks

// SessionPins adds the pins a *session.ProducerSession holds for its
// grants, per mm_hash, to dst.
var SessionPins func(s any, dst map[string]int)

// ProducerPins does the same for a *connector.Producer, under its lock.
var ProducerPins func(p any, dst map[string]int)
