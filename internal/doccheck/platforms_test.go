package doccheck

import (
	"regexp"
	"testing"
)

// The commands the README's Platforms section gives as proof that the
// module builds for a platform are ones CI runs.
func TestReadmePlatformCommandsInCI(t *testing.T) {
	platforms := section(t, read(t, "../../README.md"), "## Platforms")
	ci := read(t, "../../.ci/run")
	cmds := regexp.MustCompile("`([^`]*go (?:vet|build|test)[^`]*)`").FindAllStringSubmatch(platforms, -1)
	if len(cmds) == 0 {
		t.Fatal("no go command in the README's Platforms section")
	}
	for _, c := range cmds {
		if !regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(c[1]) + `\s*$`).MatchString(ci) {
			t.Errorf("the README's Platforms section gives %q, which .ci/run does not run", c[1])
		}
	}
}
