//go:build nixl || nixlfake

package nixl

import "fmt"

var statusErrs = map[int]error{
	-1: errNotPosted, -2: errInvalidParam, -3: errBackend, -4: errNotFound, -5: errMismatch,
	-6: errNotAllowed, -7: errRepostActive, -8: errUnknown, -9: errNotSupported,
	-10: errRemoteDisconnect, -11: errCanceled, -12: errNoTelemetry,
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
	return fmt.Errorf("nixl: %s: status %d: %w", op, st, errUnknown)
}
