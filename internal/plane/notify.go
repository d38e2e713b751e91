package plane

// Notifier is a data plane that can send a producer a completion
// notification without a READ: a consumer that will not READ a grant (its
// ack does not fit, came late, or answers a fetch that ended) sends the
// grant's notification, so that the producer unpins the entry now rather
// than at the lease. The TCP plane sends a notify frame; NIXL, genNotif.
// Notify must not block; a notification it cannot send is lost, as any
// notification may be, and the producer's lease ends the grant.
type Notifier interface {
	Notify(agent string, notif []byte) error
}
