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
// set only by writeBy (writeFull's too), which bounds the time the peer
// takes no byte, and by peer.writeNote, whose absolute bound is its
// caller's. Elsewhere a deadline covers only the handshake, a bounded
// exchange, and quietConn implements them. A deadline set around a write
// of unbounded size would cut a peer reading steadily but slowly. Any
// mention of a deadline setter counts (a call, a method value, in a
// function or a package-level literal), and a function is known by its
// receiver and name.
func TestWriteDeadlinesOnlyWhereRenewed(t *testing.T) {
	allowed := map[string]bool{
		"writeBy":                    true,
		"peer.writeNote":             true,
		"newGuardConn":               true, // the handshake's
		"guardConn.handshakeStep":    true, // the handshake's, cleared
		"guardListener.handshake":    true, // before the handshake
		"proveLocal":                 true, // the same-host proof: 56 bytes out, 32 in, before the handshake
		"quietConn.attachLocked":     true, // the deadlines quietConn keeps
		"quietConn.SetDeadline":      true,
		"quietConn.SetWriteDeadline": true,
		"quietConn.SetReadDeadline":  true,
		"quietConn.setDeadline":      true,
	}
	setters := map[string]bool{"SetWriteDeadline": true, "SetDeadline": true, "setDeadline": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			where := "package level"
			if fn, ok := d.(*ast.FuncDecl); ok {
				where = funcKey(fn)
			}
			ast.Inspect(d, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok || !setters[sel.Sel.Name] {
					return true
				}
				checked++
				if !allowed[where] {
					t.Errorf("%s: %s mentions %s; write through writeFull or writeBy instead", fset.Position(sel.Pos()), where, sel.Sel.Name)
				}
				return true
			})
		}
	}
	if checked == 0 {
		t.Fatal("no deadline found: the check reads nothing")
	}
}

// funcKey is "Recv.name" for a method, "name" for a function.
func funcKey(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}
