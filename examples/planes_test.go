//go:build !nixl

package examples_test

const buildTags = ""

// The default (shm: the same-host copy) and TCP only.
var planes = []plane{{name: "shm"}, {name: "tcp", args: []string{"-data", "tcp"}}}
