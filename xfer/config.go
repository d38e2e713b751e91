package xfer

import "time"

// Config holds the sessions' timeouts; zero fields take the defaults shown.
type Config struct {
	ReadTimeout       time.Duration // a READ's, from its ack; then it is quarantined; 20 s
	QuarantineTimeout time.Duration // then its blocks come back, Forced; 60 s
	PinLease          time.Duration // a grant's pin; a READ seen done later is not trusted; 30 s
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
