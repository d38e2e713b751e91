//go:build cgo

package main

// Symbolised C frames (NIXL, UCX) in crash tracebacks: a process-wide
// hook, so the program installs it, never the library.
import _ "github.com/ianlancetaylor/cgosymbolizer"
