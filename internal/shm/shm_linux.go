package shm

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Seals are the seals a Shared region's memfd carries: its size cannot
// change, so a reader that checks them can map it without fear of SIGBUS.
const Seals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW

// Create makes the memfd of a Shared region of size bytes, readable by
// its user only, sealed at that size.
func Create(size int) (*os.File, error) {
	fd, err := unix.MemfdCreate(FileName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), FileName)
	// /proc/<pid>/fd already keeps other users out; the mode too.
	if err := unix.Fchmod(fd, 0o600); err != nil {
		f.Close()
		return nil, fmt.Errorf("chmod region file: %w", err)
	}
	if err := f.Truncate(int64(size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("size region file: %w", err)
	}
	// Its size is final: a reader's mapping can never run past the
	// file's end (SIGBUS), whatever this process does later.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, Seals|unix.F_SEAL_SEAL); err != nil {
		f.Close()
		return nil, fmt.Errorf("seal region file: %w", err)
	}
	return f, nil
}

// Path is the path through which a same-host process of the same user
// opens f: /proc/<pid>/fd/<fd>.
func Path(f *os.File) string { return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd()) }

// AdviseHuge asks for transparent huge pages for mem (best effort: they
// may be off). On a Shared region's memfd the kernel gives them only where
// /sys/kernel/mm/transparent_hugepage/shmem_enabled allows: always,
// within_size, or advise with this advice on the mapping that faults.
func AdviseHuge(mem []byte) { _ = unix.Madvise(mem, unix.MADV_HUGEPAGE) }

// Sealed returns nil if f carries Seals (its size cannot change), else
// why not.
func Sealed(f *os.File) error {
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return err
	}
	if seals&Seals != Seals {
		return fmt.Errorf("seals %#x", seals)
	}
	return nil
}

// PopulateRead faults mem's pages in, readable (MADV_POPULATE_READ,
// Linux 5.14 and later).
func PopulateRead(mem []byte) error { return unix.Madvise(mem, unix.MADV_POPULATE_READ) }
