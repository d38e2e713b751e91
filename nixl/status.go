//go:build nixl || nixlfake

package nixl

// #include "cnixl.h"
import "C"

import (
	"errors"
	"fmt"
)

// NIXL's status codes as Go errors, one to one. They reach callers
// wrapped, in the text of the error of the call that met them.
var (
	errNotPosted        = errors.New("nixl: not posted")
	errInvalidParam     = errors.New("nixl: invalid parameter")
	errBackend          = errors.New("nixl: backend error")
	errNotFound         = errors.New("nixl: not found")
	errMismatch         = errors.New("nixl: mismatch")
	errNotAllowed       = errors.New("nixl: not allowed")
	errRepostActive     = errors.New("nixl: repost of an active request")
	errUnknown          = errors.New("nixl: unknown error")
	errNotSupported     = errors.New("nixl: not supported")
	errRemoteDisconnect = errors.New("nixl: remote disconnected")
	errCanceled         = errors.New("nixl: canceled")
	errNoTelemetry      = errors.New("nixl: no telemetry")

	// errNotMade is cnixl's own: NIXL could not make a READ's request.
	errNotMade = errors.New("nixl: NIXL could not make the READ: its blocks are not all in memory the two agents " +
		`registered (NIXL logs "no specified or potential backend had the required registrations"): ` +
		"the peer's descriptor names memory outside its registered region")
)

var statusErrs = map[int]error{
	-1: errNotPosted, -2: errInvalidParam, -3: errBackend, -4: errNotFound, -5: errMismatch,
	-6: errNotAllowed, -7: errRepostActive, -8: errUnknown, -9: errNotSupported,
	-10: errRemoteDisconnect, -11: errCanceled, -12: errNoTelemetry,
	C.CNIXL_ERR_NOT_MADE: errNotMade,
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
