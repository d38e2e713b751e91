//go:build nixl

package nixl

// Link flags for a real NIXL. The include and library paths come from the
// environment. cgo compiles the C++ shim with CGO_CPPFLAGS (and
// CGO_CXXFLAGS), never CGO_CFLAGS, so NIXL's include path goes there:
//
//	CGO_CPPFLAGS="$(pkg-config --cflags nixl)" CGO_LDFLAGS="$(pkg-config --libs nixl)"
//
// or -I/-L flags by hand (docs/nixl.md). Without them the build fails
// with an #error naming CGO_CPPFLAGS: -tags nixl asks for the real NIXL.

/*
#cgo CXXFLAGS: -std=c++17
#cgo LDFLAGS: -lnixl -lnixl_build -lnixl_common -lserdes -lstream -lstdc++
*/
import "C"
