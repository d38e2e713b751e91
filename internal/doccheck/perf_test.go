package doccheck

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// Every figure in the README's performance table (the ecxfer and baseline
// columns) is one recorded in docs/performance.md, written the same way.
func TestReadmePerformanceFigures(t *testing.T) {
	readme := read(t, "../../README.md")
	record := normalize(read(t, "../../docs/performance.md"))
	rows := tableRows(t, section(t, readme, "## Performance"))
	if len(rows) < 10 {
		t.Fatalf("%d rows in the README's performance table: the parse is wrong", len(rows))
	}
	for _, r := range rows {
		var missing []string
		for _, cell := range r[1:3] {
			for _, f := range figures(cell) {
				if !occurs(record, normalize(f.num)) {
					missing = append(missing, strings.TrimSpace(f.num+" "+f.unit))
				}
			}
		}
		if len(missing) > 0 {
			t.Errorf("README row %q: %s not in docs/performance.md", r[0], strings.Join(missing, ", "))
		}
	}
}

type figure struct{ num, unit string }

// A figure is a number or a range (71–115, 20.8–22.8k, 22,242–34,863) that
// does not start inside a word (zmq4), and the unit after it, if any:
// "42–138 / 175–255 µs" is two figures in µs.
var (
	numberRe = regexp.MustCompile(`\d+(?:,\d{3})*(?:\.\d+)?k?(?:[–-]\d+(?:,\d{3})*(?:\.\d+)?k?)?`)
	unitRe   = regexp.MustCompile(`^(?:\s*/\s*` + numberRe.String() + `)*\s*(ns|µs|ms|s\b|GB/s|k/s|/s|%|transfers/s|[KMG]iB)`)
)

func figures(cell string) []figure {
	cell = regexp.MustCompile("`[^`]*`").ReplaceAllString(cell, "``") // names, not figures
	var fs []figure
	for _, m := range numberRe.FindAllStringIndex(cell, -1) {
		if m[0] > 0 && isWordByte(cell[m[0]-1]) {
			continue
		}
		f := figure{num: cell[m[0]:m[1]]}
		if u := unitRe.FindStringSubmatch(cell[m[1]:]); u != nil {
			f.unit = u[1]
		}
		fs = append(fs, f)
	}
	return fs
}

func isWordByte(b byte) bool {
	return b == '_' || b == '.' || b == ',' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}

// occurs says whether num is in text as a number of its own: not part of
// a longer one (23–35 is not in 123–35, nor 2.1 in 2.15).
func occurs(text, num string) bool {
	for i := 0; ; {
		j := strings.Index(text[i:], num)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(num)
		before := start == 0 || !isDigitLike(text, start-1, -1)
		after := end == len(text) || !isDigitLike(text, end, +1)
		if before && after {
			return true
		}
		i = start + 1
	}
}

// isDigitLike says whether text[i] continues a number in direction dir: a
// digit, or a '.' or ',' with a digit beyond it.
func isDigitLike(text string, i, dir int) bool {
	c := text[i]
	if c >= '0' && c <= '9' {
		return true
	}
	if c == '.' || c == ',' {
		k := i + dir
		return k >= 0 && k < len(text) && text[k] >= '0' && text[k] <= '9'
	}
	return false
}

// normalize writes ranges one way: an en dash or a hyphen between digits.
func normalize(s string) string {
	return strings.ReplaceAll(s, "–", "-")
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// section returns the text under heading, up to the next heading of its
// level or higher.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("no %q in the README", heading)
	}
	level := strings.Count(strings.Fields(heading)[0], "#")
	for _, l := range strings.SplitAfter(rest, "\n") {
		if h, _, _ := strings.Cut(l, " "); strings.Trim(h, "#") == "" && len(h) > 0 && len(h) <= level {
			rest, _, _ = strings.Cut(rest, l)
			break
		}
	}
	return rest
}

// tableRows returns the cells of the body rows of the first table in s.
func tableRows(t *testing.T, s string) [][]string {
	t.Helper()
	var rows [][]string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(l, "|") {
			if len(rows) > 0 {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(l, "| "), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, cells)
	}
	if len(rows) < 2 {
		t.Fatal("no table")
	}
	for _, r := range rows {
		if len(r) != len(rows[0]) {
			t.Fatalf("a row of %d cells in a table of %d columns: %q", len(r), len(rows[0]), r)
		}
	}
	return rows[2:] // the header and the --- line
}
