//go:build nixl || nixlfake

package nixl

import "fmt"

var statusErrs = map[int]error{
	-1: ErrNotPosted, -2: ErrInvalidParam, -3: ErrBackend, -4: ErrNotFound, -5: ErrMismatch,
	-6: ErrNotAllowed, -7: ErrRepostActive, -8: ErrUnknown, -9: ErrNotSupported,
	-10: ErrRemoteDisconnect, -11: ErrCanceled, -12: ErrNoTelemetry,
}

// statusErr maps a nixl_status_t to an error: nil for success and in
// progress.
func statusErr(op string, st int) error {
	if st >= 0 {
		return nil
	}
	if err, ok := statusErrs[st]; ok {
		return fmt.Errorf("nixl: %s: %w", op, err)
	}
	return fmt.Errorf("nixl: %s: status %d: %w", op, st, ErrUnknown)
}
