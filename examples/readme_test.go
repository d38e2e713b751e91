package examples_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README's consumer and producer loops compile against the module as
// it is.
func TestReadmeLoopsCompile(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src := `package engine

import (
	"context"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)
`
	for _, name := range []string{"consumer-loop", "producer-loop"} {
		m := regexp.MustCompile("(?s)<!-- " + name + " -->\n```go\n(.*?)```\n<!-- /" + name + " -->").FindSubmatch(readme)
		if m == nil {
			t.Fatalf("no %s block in the README", name)
		}
		if n := strings.Count(string(m[1]), "\n"); n > 40 {
			t.Errorf("the README's %s is %d lines: keep it to 40", name, n)
		}
		src += "\n" + string(m[1])
	}
	vetInModule(t, []byte(src))
}

// The metrics snippet of docs/operations.md compiles, inside a function
// given a pool and a producer.
func TestReadmeMetricsCompiles(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- metrics -->\n```go\n(.*?)```\n<!-- /metrics -->").FindSubmatch(doc)
	if m == nil {
		t.Fatal("no metrics block in docs/operations.md")
	}
	src := `package engine

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/session/connector/metrics"
)

func serve(pool *connector.Pool, prod *connector.Producer) {
` + string(m[1]) + "}\n"
	vetInModule(t, []byte(src))
}

// vetInModule vets src as a package inside the module, so that its imports
// resolve; the package is removed afterwards.
func vetInModule(t *testing.T, src []byte) {
	t.Helper()
	dir, err := os.MkdirTemp("../internal", "readme-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "engine.go"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "vet", "./"+filepath.Join("internal", filepath.Base(dir)))
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's code does not build:\n%s", out)
	}
}

// The probe commands of the README and docs/ use flags the probe has.
func TestReadmeProbeCommands(t *testing.T) {
	var cmds [][][]byte
	for _, f := range []string{"../README.md", "../docs/operations.md"} {
		doc, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		found := regexp.MustCompile(`go run \./examples/probe([^\n`+"`"+`]*)`).FindAllSubmatch(doc, -1)
		if len(found) == 0 {
			t.Errorf("no probe command in %s", f)
		}
		cmds = append(cmds, found...)
	}
	help, _ := exec.Command(build(t, "probe"), "-h").CombinedOutput() // -h exits 2
	for _, c := range cmds {
		for _, f := range regexp.MustCompile(`\s-([a-z-]+)`).FindAllSubmatch(c[1], -1) {
			if !regexp.MustCompile(`(?m)^\s+-` + string(f[1]) + `\b`).Match(help) {
				t.Errorf("the README's probe command uses -%s, which the probe does not have", f[1])
			}
		}
	}
}
