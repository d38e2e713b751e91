//go:build nixl

package nixl

// The real NIXL is loaded at run time (cnixl_nixl.c): building needs no
// NIXL headers or libraries, and a binary without NIXL installed starts and
// runs everything but NIXL agents. Where New finds NIXL's C API
// (libnixl_capi.so): the file EnvLib names, else the dynamic loader's
// search, which an rpath in the binary extends:
//
//	CGO_LDFLAGS="-Wl,-rpath,$NIXL/lib" go build -tags nixl ...
//
// (docs/nixl.md). Linking NIXL as well (CGO_LDFLAGS from pkg-config
// --libs nixl) still works: the library loaded is the linked one's
// neighbour, found through the same rpath.

/*
#cgo LDFLAGS: -ldl
*/
import "C"
