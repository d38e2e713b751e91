//go:build nixl

package nixl

// Link flags for a real NIXL. The include and library paths come from the
// environment. cgo compiles the C++ shim with CGO_CPPFLAGS (and
// CGO_CXXFLAGS), never CGO_CFLAGS, so NIXL's include path goes there:
//
//	CGO_CPPFLAGS="$(pkg-config --cflags nixl)" CGO_LDFLAGS="$(pkg-config --libs nixl)"
//
// or -I/-L flags by hand (README). Without them the shim compiles a stub
// with a warning, and New returns ErrNotBuilt.

/*
#cgo CXXFLAGS: -std=c++17
#cgo LDFLAGS: -lnixl -lnixl_build -lnixl_common -lserdes -lstream -lstdc++
*/
import "C"
