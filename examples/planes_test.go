//go:build !nixl

package examples_test

const buildTags = ""

var planes = []plane{{name: "tcp"}}
