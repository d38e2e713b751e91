package transport

import (
	"fmt"
	"os"
	"strings"

	"github.com/ecxfer/ecxfer/internal/shm"
	"golang.org/x/sys/unix"
)

// openRegionFile opens the producer's region file that path, one of the
// producer's descriptors, names. Only a producer's region: metadata could
// name any file of ours. The producer can swap the descriptor between a
// check of the path and the open, and an open may wait (a FIFO's, or a
// FUSE or NFS file's, whatever the flags), blocking every caller of the
// plane with it. So the file is first reached with O_PATH, which opens
// nothing, and checked as reached: a memfd of a region's name on shmem
// (not hugetlbfs, whose holes fault as SIGBUS when no huge page is free);
// only that file, whose open never waits, is then opened, through the
// O_PATH descriptor, and checked for seals, since a file that could
// shrink could make a copy out of our mapping fault.
func openRegionFile(path string) (*os.File, error) {
	if target, err := os.Readlink(path); err != nil || !strings.HasPrefix(target, "/memfd:"+shm.FileName) {
		return nil, fmt.Errorf("%w: %s is not a shared region (%s)", errBadMeta, path, target)
	}
	pfd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	reached := fmt.Sprintf("/proc/self/fd/%d", pfd)
	target, _ := os.Readlink(reached)
	var st unix.Stat_t
	var fs unix.Statfs_t
	switch {
	case !strings.HasPrefix(target, "/memfd:"+shm.FileName):
		return nil, fmt.Errorf("%w: %s is not a shared region (%s)", errBadMeta, path, target)
	case unix.Fstat(pfd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, fmt.Errorf("%w: %s is not a regular file", errBadMeta, path)
	case unix.Fstatfs(pfd, &fs) != nil || fs.Type != unix.TMPFS_MAGIC:
		return nil, fmt.Errorf("%w: %s is not on shared memory (filesystem %#x)", errBadMeta, path, fs.Type)
	}
	fd, err := unix.Open(reached, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path)
	var st2 unix.Stat_t
	switch {
	case unix.Fstat(fd, &st2) != nil || st2.Dev != st.Dev || st2.Ino != st.Ino:
		err = fmt.Errorf("%w: %s changed while opened", errBadMeta, path)
	default:
		if e := shm.Sealed(f); e != nil {
			err = fmt.Errorf("%w: %s is not sealed against resizing (%v)", errBadMeta, path, e)
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// dataExtents calls f with each range of file fd, up to size, that holds
// data (SEEK_DATA, SEEK_HOLE), until f returns false.
func dataExtents(fd, size int, f func(lo, hi int) bool) {
	for off := 0; off < size; {
		lo, err := unix.Seek(fd, int64(off), unix.SEEK_DATA)
		if err != nil || lo >= int64(size) {
			return // ENXIO: no data past off
		}
		hi, err := unix.Seek(fd, lo, unix.SEEK_HOLE)
		if err != nil || hi > int64(size) || hi <= lo {
			hi = int64(size)
		}
		if !f(int(lo), int(hi)) {
			return
		}
		off = int(hi)
	}
}
