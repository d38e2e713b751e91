//go:build nixl || nixlfake

package nixl

/*
#include <stdlib.h>
#include "cnixl.h"
*/
import "C"

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"
)

// NIXL's C API reports most failures as one backend error, and NIXL
// explains them only in its own log (docs/nixl.md). The hints below name
// the fix for the configuration errors docs/nixl.md knows.

// backendHint says why creating cfg's backend likely failed: a plugin
// NIXL cannot find, or UCX's shared-memory transports without the error
// handling mode they need. "" when neither.
func backendHint(cfg Config) string {
	plugin := "libplugin_" + cfg.Backend + ".so"
	dir, from := os.Getenv("NIXL_PLUGIN_DIR"), "NIXL_PLUGIN_DIR"
	if dir == "" {
		if d := C.cnixl_nixl_dir(); d != nil {
			dir, from = filepath.Join(C.GoString(d), "plugins"), "plugins/ beside libnixl.so; NIXL_PLUGIN_DIR unset"
			C.cnixl_free(unsafe.Pointer(d))
		}
	}
	if dir != "" {
		if _, err := os.Stat(filepath.Join(dir, plugin)); err != nil {
			return fmt.Sprintf("NIXL found no %s backend: no %s in %s (%s); set NIXL_PLUGIN_DIR to the folder holding it",
				cfg.Backend, plugin, dir, from)
		}
	}
	if tls := os.Getenv("UCX_TLS"); cfg.Backend == "UCX" && sharedMemoryTLS(tls) && cfg.Params["ucx_error_handling_mode"] != "none" {
		return fmt.Sprintf("UCX_TLS=%s needs the backend parameter ucx_error_handling_mode=none "+
			"(Config.Params; -nixl-params ucx_error_handling_mode=none in the examples)", tls)
	}
	return ""
}

// sharedMemoryTLS reports whether UCX_TLS names a shared-memory transport
// (sm, posix, sysv), which UCX's default peer error handling cannot use.
func sharedMemoryTLS(tls string) bool {
	for _, t := range strings.Split(strings.TrimPrefix(tls, "^"), ",") {
		switch t {
		case "sm", "shm", "posix", "sysv":
			return !strings.HasPrefix(tls, "^")
		}
	}
	return false
}

// loadErr is the error of a failed load of a peer's metadata; one NIXL's
// backend failed says what it could not reach.
func loadErr(metadata []byte, st int) error {
	err := statusErr("load remote metadata", st)
	if st == C.CNIXL_ERR_BACKEND || st == C.CNIXL_ERR_REMOTE_DISCONNECT {
		err = fmt.Errorf("%w: %s", err, reachHint(metadata))
	}
	return err
}

// reachHint explains a failed load of a peer's metadata: NIXL connects to
// the transport addresses in it, which must be reachable from here.
func reachHint(metadata []byte) string {
	tls := os.Getenv("UCX_TLS")
	if tls == "" {
		tls = "unset (UCX's choice)"
	}
	return fmt.Sprintf("could not reach the peer agent %s at the transport address its metadata names (UCX_TLS=%s): "+
		"is the producer running, reachable from here, and using a transport this side allows?", peerAgentName(metadata), tls)
}

// peerAgentName is the agent name in NIXL metadata (serialized as "Agent",
// an 8-byte little-endian length, the name), quoted, or a placeholder:
// the metadata is the peer's, so nothing in it is trusted.
func peerAgentName(metadata []byte) string {
	i := bytes.Index(metadata, []byte("Agent"))
	if i < 0 || len(metadata)-i-5 < 8 {
		return "(name unreadable)"
	}
	rest := metadata[i+5:]
	n := binary.LittleEndian.Uint64(rest)
	if n == 0 || n > 256 || n > uint64(len(rest)-8) {
		return "(name unreadable)"
	}
	return strconv.Quote(string(rest[8 : 8+n]))
}
