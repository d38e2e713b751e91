package transport

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// The rule behind TestWriteDeadlineRenewedOnProgress: a write deadline is
// set only by writeFull and writeBy, which renew it whenever the peer
// takes a byte, and by writeNote, whose absolute bound is its caller's.
// Elsewhere a deadline may cover only the handshake, a bounded exchange.
// A deadline set around a write of unbounded size would cut a peer that
// reads steadily but slowly.
func TestWriteDeadlinesOnlyWhereRenewed(t *testing.T) {
	allowed := map[string]bool{
		"writeFull":     true,
		"writeBy":       true,
		"writeNote":     true,
		"newGuardConn":  true, // the handshake's
		"handshakeStep": true, // the handshake's, cleared
		"handshake":     true, // the listener's, before the handshake
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || name == "quiet.go" { // quiet.go implements deadlines
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok || (sel.Sel.Name != "SetWriteDeadline" && sel.Sel.Name != "SetDeadline") {
					return true
				}
				checked++
				if !allowed[fn.Name.Name] {
					t.Errorf("%s: %s sets a write deadline; write through writeFull or writeBy instead", fset.Position(call.Pos()), fn.Name.Name)
				}
				return true
			})
		}
	}
	if checked == 0 {
		t.Fatal("no deadline found: the check reads nothing")
	}
}
