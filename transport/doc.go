// Package transport holds the networks the protocol runs over: the ZeroMQ
// control plane ([Server], the producer's ROUTER; [Client], a DEALER per
// producer) and the pure-Go data plane [TCPData], which most programs hand
// to connector.NewPool or connector.NewProducer, as the README shows.
//
// Send, Reply, Drain and Dead never block; queues are bounded and refuse
// with xfer.ErrQueueFull. Whatever a peer sends wrong closes that one
// connection. TCPData serves a READ only under a live grant, copying on one
// Linux host out of a cache.RegionConfig.Shared region, else over TCP.
// Bounds: docs/operations.md.
package transport
