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
// it: with images of mixed sizes, 60 to 90 runs an entry after churn.
//
// So take hands out the shortest run that holds a whole entry (best fit),
// else the longest runs first; put merges a freed run with its free
// neighbours. Each costs what the runs it touches cost, not what is free:
// a run is found by its ends in two tables the size of the cache. Run
// slots are int32: a cache has at most half its blocks' count of runs.
type freeRuns struct {
	n      int             // free blocks
	runs   []run           // by index; those in spare are unused
	spare  []int32         //
	first  []int32         // first[id]: 1 + the index of the run that starts at id, or 0
	last   []int32         // last[id]: the same, for the run that ends at id
	bySize map[int][]int32 // run indexes by length
	sizes  []int           // the lengths bySize holds, ascending
}

type run struct{ start, n, at int } // at: its place in bySize[n]

func newFreeRuns(capacity int) *freeRuns {
	capacity = max(capacity, 0)
	f := &freeRuns{first: make([]int32, capacity), last: make([]int32, capacity), bySize: map[int][]int32{}}
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
	if start > 0 && f.last[start-1] != 0 {
		l := f.last[start-1] - 1
		f.unlink(l)
		start, n = f.runs[l].start, n+f.runs[l].n
		f.spare = append(f.spare, l)
	}
	if end := start + n; end < len(f.first) && f.first[end] != 0 {
		r := f.first[end] - 1
		f.unlink(r)
		n += f.runs[r].n
		f.spare = append(f.spare, r)
	}
	f.link(f.slot(), start, n)
}

// slot returns the index of an unused run.
func (f *freeRuns) slot() int32 {
	if k := len(f.spare); k > 0 {
		i := f.spare[k-1]
		f.spare = f.spare[:k-1]
		return i
	}
	f.runs = append(f.runs, run{})
	return int32(len(f.runs) - 1)
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
		s := f.bySize[f.sizes[min(i, len(f.sizes)-1)]] // the shortest that holds n, else the longest
		ri := s[len(s)-1]
		f.unlink(ri)
		r := f.runs[ri]
		k := min(n, r.n)
		got = append(got, run{start: r.start, n: k})
		if k < r.n {
			f.link(ri, r.start+k, r.n-k)
		} else {
			f.spare = append(f.spare, ri)
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

func (f *freeRuns) link(i int32, start, n int) {
	f.first[start], f.last[start+n-1] = i+1, i+1
	s, ok := f.bySize[n]
	if !ok {
		k, _ := slices.BinarySearch(f.sizes, n)
		f.sizes = slices.Insert(f.sizes, k, n)
	}
	f.runs[i] = run{start: start, n: n, at: len(s)}
	f.bySize[n] = append(s, i)
}

func (f *freeRuns) unlink(i int32) {
	r := f.runs[i]
	f.first[r.start], f.last[r.start+r.n-1] = 0, 0
	s := f.bySize[r.n]
	moved := s[len(s)-1]
	s[r.at], f.runs[moved].at = moved, r.at
	if s = s[:len(s)-1]; len(s) > 0 {
		f.bySize[r.n] = s
		return
	}
	delete(f.bySize, r.n)
	k, _ := slices.BinarySearch(f.sizes, r.n)
	f.sizes = slices.Delete(f.sizes, k, k+1)
}
