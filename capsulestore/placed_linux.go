package capsulestore

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// oDirectFlag is O_DIRECT: placed leaves bypass the page cache.
const oDirectFlag = syscall.O_DIRECT

// startWriteback asks the kernel to start writing f's dirty pages to the
// disk, without waiting; an error only leaves the work to the final fsync.
func startWriteback(f *os.File) {
	_ = unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
}
