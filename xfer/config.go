package xfer

import "time"

// Config holds the consumer's and producer's timeouts. Zero fields take the
// reference's values (see WithDefaults).
type Config struct {
	// ReadTimeout bounds a READ, from the ack that started it. A READ still
	// in progress after it is quarantined. Default 20 s.
	ReadTimeout time.Duration
	// QuarantineTimeout bounds quarantine. A READ still not confirmed ended
	// after it is forced out (released, counted, reported as forced).
	// Default 60 s.
	QuarantineTimeout time.Duration
	// PinLease is how long a producer holds a grant's pin. The consumer does
	// not trust a READ first seen complete later than request time +
	// PinLease: the producer may have reused the blocks. Default 30 s.
	PinLease time.Duration
}

// WithDefaults returns c with every zero field set to its default, the
// reference's: Config{}.WithDefaults() is the reference's timeouts.
func (c Config) WithDefaults() Config {
	d := Config{ReadTimeout: 20 * time.Second, QuarantineTimeout: 60 * time.Second, PinLease: 30 * time.Second}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = d.ReadTimeout
	}
	if c.QuarantineTimeout <= 0 {
		c.QuarantineTimeout = d.QuarantineTimeout
	}
	if c.PinLease <= 0 {
		c.PinLease = d.PinLease
	}
	return c
}
