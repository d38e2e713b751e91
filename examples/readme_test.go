package examples_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// The README's "Using it" code compiles against the module as it is.
func TestReadmeUsingItCompiles(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- using-it -->\n```go\n(.*?)```\n<!-- /using-it -->").FindSubmatch(readme)
	if m == nil {
		t.Fatal("no using-it block in the README")
	}
	vetInModule(t, m[1])
}

// The README's metrics snippet compiles, inside a function given a pool
// and a producer.
func TestReadmeMetricsCompiles(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- metrics -->\n```go\n(.*?)```\n<!-- /metrics -->").FindSubmatch(readme)
	if m == nil {
		t.Fatal("no metrics block in the README")
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

// The README's probe commands use flags the probe has.
func TestReadmeProbeCommands(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	cmds := regexp.MustCompile(`go run \./examples/probe([^\n`+"`"+`]*)`).FindAllSubmatch(readme, -1)
	if len(cmds) == 0 {
		t.Fatal("no probe command in the README")
	}
	cmd := exec.Command("go", "run", "./examples/probe", "-h")
	cmd.Dir = ".."
	help, _ := cmd.CombinedOutput() // -h exits 2
	for _, c := range cmds {
		for _, f := range regexp.MustCompile(`\s-([a-z-]+)`).FindAllSubmatch(c[1], -1) {
			if !regexp.MustCompile(`(?m)^\s+-` + string(f[1]) + `\b`).Match(help) {
				t.Errorf("the README's probe command uses -%s, which the probe does not have", f[1])
			}
		}
	}
}
