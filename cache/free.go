package cache

import "slices"

// freeRuns holds the free blocks as maximal runs of consecutive ids.
//
// An entry's bytes move run by run: a same-host copy makes one memmove
// per run (and Go's memmove writes around the CPU cache only from 1 MiB),
// a TCP READ names its runs, and a consumer's blocks split the copy
// wherever the producer's do. A 4.5 MiB entry copied out of cold memory
// took 1.5 times as long in runs of 512 KiB as in one run, and 1.8 times
// in runs of one 8 KiB block. A free list that hands out whatever was
// freed last splits every entry into the pieces of those evicted before
// it: with images of mixed sizes, 20 runs an entry after churn.
//
// So take hands out the shortest run that holds a whole entry (best fit),
// else the longest runs first; put merges a freed run with its free
// neighbours. Each costs what the runs it touches cost, not what is free.
type freeRuns struct {
	n       int            // free blocks
	byStart map[int]*run   // by first id
	byEnd   map[int]*run   // by the id after the last
	bySize  map[int][]*run // by length
	sizes   []int          // the lengths bySize holds, ascending
}

type run struct{ start, n, at int } // at: its index in bySize[n]

func newFreeRuns(capacity int) *freeRuns {
	f := &freeRuns{byStart: map[int]*run{}, byEnd: map[int]*run{}, bySize: map[int][]*run{}}
	if capacity > 0 {
		f.put(0, capacity)
	}
	return f
}

// release frees blocks, ascending, none of them free.
func (f *freeRuns) release(blocks []int) {
	for i := 0; i < len(blocks); {
		j := i + 1
		for j < len(blocks) && blocks[j] == blocks[j-1]+1 {
			j++
		}
		f.put(blocks[i], j-i)
		i = j
	}
}

// put frees the n blocks from start, merged with the free runs beside them.
func (f *freeRuns) put(start, n int) {
	f.n += n
	if l := f.byEnd[start]; l != nil {
		f.unlink(l)
		start, n = l.start, n+l.n
	}
	if r := f.byStart[start+n]; r != nil {
		f.unlink(r)
		n += r.n
	}
	f.link(&run{start: start, n: n})
}

// holds reports whether one free run has n blocks or more.
func (f *freeRuns) holds(n int) bool { return len(f.sizes) > 0 && f.sizes[len(f.sizes)-1] >= n }

// take appends n free blocks to dst, ascending, in as few runs as the free
// runs allow; n <= f.n.
func (f *freeRuns) take(dst []int, n int) []int {
	f.n -= n
	var buf [8]run
	got := buf[:0] // the runs taken, then put in order
	for n > 0 {
		i, _ := slices.BinarySearch(f.sizes, n)
		i = min(i, len(f.sizes)-1) // the shortest that holds n, else the longest
		s := f.bySize[f.sizes[i]]
		r := s[len(s)-1]
		f.unlink(r)
		k := min(n, r.n)
		got = append(got, run{start: r.start, n: k})
		if k < r.n {
			f.link(&run{start: r.start + k, n: r.n - k})
		}
		n -= k
	}
	slices.SortFunc(got, func(a, b run) int { return a.start - b.start })
	for _, r := range got {
		for id := r.start; id < r.start+r.n; id++ {
			dst = append(dst, id)
		}
	}
	return dst
}

func (f *freeRuns) link(r *run) {
	f.byStart[r.start], f.byEnd[r.start+r.n] = r, r
	s, ok := f.bySize[r.n]
	if !ok {
		i, _ := slices.BinarySearch(f.sizes, r.n)
		f.sizes = slices.Insert(f.sizes, i, r.n)
	}
	r.at = len(s)
	f.bySize[r.n] = append(s, r)
}

func (f *freeRuns) unlink(r *run) {
	delete(f.byStart, r.start)
	delete(f.byEnd, r.start+r.n)
	s := f.bySize[r.n]
	last := s[len(s)-1]
	s[r.at], last.at = last, r.at
	s[len(s)-1] = nil
	if s = s[:len(s)-1]; len(s) > 0 {
		f.bySize[r.n] = s
		return
	}
	delete(f.bySize, r.n)
	i, _ := slices.BinarySearch(f.sizes, r.n)
	f.sizes = slices.Delete(f.sizes, i, i+1)
}
