package xfer

import "time"

// Config holds the consumer's and producer's timeouts. Zero fields take the
// reference's values.
type Config struct {
	// ReadTimeout bounds a READ, from its ack; then it is quarantined.
	// Default 20 s.
	ReadTimeout time.Duration
	// QuarantineTimeout bounds quarantine; then its blocks come back, Forced.
	// Default 60 s.
	QuarantineTimeout time.Duration
	// PinLease is how long a producer pins a grant's entry; a READ seen
	// complete after it is not trusted. Default 30 s.
	PinLease time.Duration
}

// WithDefaults returns c with every zero field set to its default.
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
