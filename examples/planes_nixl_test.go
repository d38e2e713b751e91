//go:build nixl

package examples_test

// Built with -tags nixl (and NIXL's flags in CGO_CPPFLAGS/CGO_LDFLAGS, which
// go build passes on): the programs run over NIXL too, over UCX's TCP and
// shared-memory transports.
const buildTags = "nixl"

var planes = []plane{
	{name: "shm"},
	{name: "tcp", args: []string{"-data", "tcp"}},
	{name: "nixl-ucx-tcp", args: []string{"-data", "nixl"}, env: map[string]string{"UCX_TLS": "tcp"}},
	{name: "nixl-ucx-sm", args: []string{"-data", "nixl", "-nixl-params", "ucx_error_handling_mode=none"},
		env: map[string]string{"UCX_TLS": "sm"}},
}
