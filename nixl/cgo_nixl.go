//go:build nixl

package nixl

// Link flags for a real NIXL. Compile and link paths come from the
// environment: CGO_CFLAGS="$(pkg-config --cflags nixl)" and
// CGO_LDFLAGS="$(pkg-config --libs nixl)", or -I/-L flags by hand (README).

/*
#cgo CXXFLAGS: -std=c++17
#cgo LDFLAGS: -lnixl -lstdc++
*/
import "C"
