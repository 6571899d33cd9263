// Command slowfs mounts a directory through FUSE as a checkpoint volume whose reads and writes take
// as long as they would on a slow shared file system, so tests feel real-size checkpoint timing.
//
// It is a SIMULATION. The volume it stands in for is Amazon FSx for Lustre (about 300 MB/s for a
// 1.2 TiB volume, so a 96 GB checkpoint takes about 5 minutes to write or to read back), which
// cannot run here. The delay is applied at the volume, under the file system calls, so the
// project's worker and any user's training script feel it the same way.
//
// Model:
//
//   - The volume has ONE shared write pipe and ONE shared read pipe (all clients, all files).
//   - A write of n bytes is copied to the backing file at once and returns, but reserves
//     n*scale/write_bps seconds on the write pipe (busyUntil = max(now, busyUntil) + cost); the
//     file handle and its inode remember busyUntil as the time their data is "on storage".
//     If the pipe's backlog (busyUntil - now) is above --max-backlog-seconds, the write blocks until
//     it is back at that limit (as the kernel throttles a writer with too many dirty pages).
//   - fsync/fdatasync (through any handle of the file) sleeps until the file's data is on storage.
//     close does not wait (as on Lustre): only fsync/fdatasync does.
//   - A read of n bytes sleeps on the read pipe: readBusyUntil = max(now, readBusyUntil) +
//     n*scale/read_bps, then returns once that time has come.
//   - copy_file_range counts as a read plus a write.
//   - Everything else (lookup, mkdir, rename, unlink, readdir, stat, statfs, xattrs,
//     setattr/truncate, fallocate, locks) is the plain go-fuse loopback, undelayed.
//
// --scale F makes each byte count as F bytes, so a test's KB-size state can stand for a GB-size
// one. A bps of 0 leaves that direction unthrottled.
//
// The file handles do not offer FUSE passthrough (a backing fd the kernel would read and write
// directly), which would bypass the delays; the kernel page cache still serves re-reads within one
// open (each open drops the cache, as go-fuse's default open flags ask).
//
//	slowfs --backing DIR --mount DIR [--write-bps N] [--read-bps N] [--scale F] [--max-backlog-seconds S]
//
// Prints "slowfs: mounted DIR" once mounted, serves until SIGTERM/SIGINT, then unmounts and exits 0.
// Needs root (mount(2) directly: go-fuse's DirectMount, no fusermount).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// pipe is one direction of the volume's bandwidth, shared by every client and file.
type pipe struct {
	bps   float64 // bytes per second; 0 = unthrottled
	scale float64

	mu        sync.Mutex
	busyUntil time.Time
	bytes     int64 // real bytes through the pipe, for the exit summary
}

// reserve books n bytes on the pipe and returns when the pipe will have moved them.
func (p *pipe) reserve(n int) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bytes += int64(n)
	now := time.Now()
	if p.bps <= 0 || n <= 0 {
		return now
	}
	if p.busyUntil.Before(now) {
		p.busyUntil = now
	}
	p.busyUntil = p.busyUntil.Add(time.Duration(float64(n) * p.scale / p.bps * float64(time.Second)))
	return p.busyUntil
}

// sleepUntil waits until t, or until the kernel interrupts the request (the caller got a signal).
func sleepUntil(ctx context.Context, t time.Time) syscall.Errno {
	d := time.Until(t)
	if d <= 0 {
		return fs.OK
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return fs.OK
	case <-ctx.Done():
		return syscall.EINTR
	}
}

type volume struct {
	write, read pipe
	maxBacklog  time.Duration
}

// slowNode is the loopback node with a record of when its data is on storage (for fsync through any
// handle). Its Open/Create/Tmpfile wrap the loopback's file handle in a slowFile.
type slowNode struct {
	*fs.LoopbackNode
	vol *volume

	mu        sync.Mutex
	durableAt time.Time
}

var (
	_ = (fs.NodeWrapChilder)((*slowNode)(nil))
	_ = (fs.NodeOpener)((*slowNode)(nil))
	_ = (fs.NodeCreater)((*slowNode)(nil))
	_ = (fs.NodeTmpfiler)((*slowNode)(nil))
	_ = (fs.NodeCopyFileRanger)((*slowNode)(nil))
)

// WrapChild makes every node the loopback creates (lookup, create, mkdir, ...) a slowNode.
func (n *slowNode) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &slowNode{LoopbackNode: ops.(*fs.LoopbackNode), vol: n.vol}
}

func (n *slowNode) noteWritten(t time.Time) {
	n.mu.Lock()
	if t.After(n.durableAt) {
		n.durableAt = t
	}
	n.mu.Unlock()
}

func (n *slowNode) durable() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.durableAt
}

func (n *slowNode) wrap(fh fs.FileHandle) fs.FileHandle {
	if fh == nil {
		return nil
	}
	return &slowFile{inner: fh, node: n}
}

func (n *slowNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return n.wrap(fh), fuseFlags, 0
}

func (n *slowNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	inode, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return inode, childNode(inode, n).wrap(fh), fuseFlags, 0
}

func (n *slowNode) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	inode, fh, fuseFlags, errno := n.LoopbackNode.Tmpfile(ctx, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return inode, childNode(inode, n).wrap(fh), fuseFlags, 0
}

// childNode is the slowNode of an inode the loopback just made (WrapChild made it one).
func childNode(inode *fs.Inode, parent *slowNode) *slowNode {
	if sn, ok := inode.Operations().(*slowNode); ok {
		return sn
	}
	// Not expected; a fresh record still gives correct (if per-handle) fsync timing.
	return &slowNode{vol: parent.vol}
}

// CopyFileRange copies inside the backing file system and charges the bytes to both pipes.
func (n *slowNode) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle,
	offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	in, ok1 := fhIn.(*slowFile)
	dst, ok2 := fhOut.(*slowFile)
	if !ok1 || !ok2 {
		return 0, syscall.ENOTSUP
	}
	count, errno := n.LoopbackNode.CopyFileRange(ctx, in.inner, offIn, out, dst.inner, offOut, length, flags)
	if errno != 0 || count == 0 {
		return count, errno
	}
	// The copy is done: an interrupted wait still reports it.
	_ = sleepUntil(ctx, n.vol.read.reserve(int(count)))
	dst.wrote(ctx, int(count))
	return count, 0
}

// slowFile wraps the loopback's file handle: it forwards every file operation the loopback file
// implements and adds the delays of the model to Read, Write(v) and Fsync. It deliberately does
// not implement FilePassthroughFder.
type slowFile struct {
	inner fs.FileHandle
	node  *slowNode

	mu        sync.Mutex
	durableAt time.Time
}

var (
	_ = (fs.FileReader)((*slowFile)(nil))
	_ = (fs.FileWriter)((*slowFile)(nil))
	_ = (fs.FileWritever)((*slowFile)(nil))
	_ = (fs.FileFsyncer)((*slowFile)(nil))
	_ = (fs.FileFlusher)((*slowFile)(nil))
	_ = (fs.FileReleaser)((*slowFile)(nil))
	_ = (fs.FileGetattrer)((*slowFile)(nil))
	_ = (fs.FileStatxer)((*slowFile)(nil))
	_ = (fs.FileSetattrer)((*slowFile)(nil))
	_ = (fs.FileLseeker)((*slowFile)(nil))
	_ = (fs.FileAllocater)((*slowFile)(nil))
	_ = (fs.FileGetlker)((*slowFile)(nil))
	_ = (fs.FileSetlker)((*slowFile)(nil))
	_ = (fs.FileSetlkwer)((*slowFile)(nil))
	_ = (fs.FileIoctler)((*slowFile)(nil))
)

// wrote books n written bytes on the write pipe, records when they are on storage, and blocks
// while the pipe's backlog is above the limit. The data is already in the backing file, so an
// interrupted wait still reports the write as done.
func (f *slowFile) wrote(ctx context.Context, n int) {
	vol := f.node.vol
	at := vol.write.reserve(n)
	f.mu.Lock()
	if at.After(f.durableAt) {
		f.durableAt = at
	}
	f.mu.Unlock()
	f.node.noteWritten(at)
	if vol.write.bps > 0 {
		_ = sleepUntil(ctx, at.Add(-vol.maxBacklog))
	}
}

func (f *slowFile) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	r, ok := f.inner.(fs.FileReader)
	if !ok {
		return nil, syscall.ENOSYS
	}
	res, errno := r.Read(ctx, buf, off)
	if errno != 0 {
		return res, errno
	}
	// Read the bytes now, so the pipe is charged for what the file really holds (not the request's
	// size past EOF).
	data, status := res.Bytes(buf)
	res.Done()
	if !status.Ok() {
		return nil, syscall.Errno(status)
	}
	if errno := sleepUntil(ctx, f.node.vol.read.reserve(len(data))); errno != 0 {
		return nil, errno
	}
	return fuse.ReadResultData(data), 0
}

func (f *slowFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	w, ok := f.inner.(fs.FileWriter)
	if !ok {
		return 0, syscall.ENOSYS
	}
	n, errno := w.Write(ctx, data, off)
	if n > 0 {
		f.wrote(ctx, int(n))
	}
	return n, errno
}

func (f *slowFile) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	if w, ok := f.inner.(fs.FileWritever); ok {
		n, errno := w.Writev(ctx, data, off)
		if n > 0 {
			f.wrote(ctx, int(n))
		}
		return n, errno
	}
	var total uint32
	for _, d := range data {
		n, errno := f.Write(ctx, d, off+int64(total))
		total += n
		if errno != 0 || int(n) < len(d) {
			return total, errno
		}
	}
	return total, 0
}

// Fsync (fsync and fdatasync) waits until the file's data is on storage: this handle's writes and
// any other handle's writes to the same inode.
func (f *slowFile) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	s, ok := f.inner.(fs.FileFsyncer)
	if !ok {
		return syscall.ENOSYS
	}
	if errno := s.Fsync(ctx, flags); errno != 0 {
		return errno
	}
	f.mu.Lock()
	at := f.durableAt
	f.mu.Unlock()
	if nodeAt := f.node.durable(); nodeAt.After(at) {
		at = nodeAt
	}
	return sleepUntil(ctx, at)
}

// Flush (each close) does not wait for the data: as on Lustre, only fsync does.
func (f *slowFile) Flush(ctx context.Context) syscall.Errno {
	if x, ok := f.inner.(fs.FileFlusher); ok {
		return x.Flush(ctx)
	}
	return fs.OK
}

func (f *slowFile) Release(ctx context.Context) syscall.Errno {
	if x, ok := f.inner.(fs.FileReleaser); ok {
		return x.Release(ctx)
	}
	return fs.OK
}

func (f *slowFile) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	if x, ok := f.inner.(fs.FileGetattrer); ok {
		return x.Getattr(ctx, out)
	}
	return syscall.ENOSYS
}

func (f *slowFile) Statx(ctx context.Context, flags uint32, mask uint32, out *fuse.StatxOut) syscall.Errno {
	if x, ok := f.inner.(fs.FileStatxer); ok {
		return x.Statx(ctx, flags, mask, out)
	}
	return syscall.ENOSYS
}

func (f *slowFile) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if x, ok := f.inner.(fs.FileSetattrer); ok {
		return x.Setattr(ctx, in, out)
	}
	return syscall.ENOSYS
}

func (f *slowFile) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	if x, ok := f.inner.(fs.FileLseeker); ok {
		return x.Lseek(ctx, off, whence)
	}
	return 0, syscall.ENOSYS
}

func (f *slowFile) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	if x, ok := f.inner.(fs.FileAllocater); ok {
		return x.Allocate(ctx, off, size, mode)
	}
	return syscall.ENOSYS
}

func (f *slowFile) Getlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	if x, ok := f.inner.(fs.FileGetlker); ok {
		return x.Getlk(ctx, owner, lk, flags, out)
	}
	return syscall.ENOSYS
}

func (f *slowFile) Setlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	if x, ok := f.inner.(fs.FileSetlker); ok {
		return x.Setlk(ctx, owner, lk, flags)
	}
	return syscall.ENOSYS
}

func (f *slowFile) Setlkw(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	if x, ok := f.inner.(fs.FileSetlkwer); ok {
		return x.Setlkw(ctx, owner, lk, flags)
	}
	return syscall.ENOSYS
}

func (f *slowFile) Ioctl(ctx context.Context, cmd uint32, arg uint64, input []byte, output []byte) (int32, syscall.Errno) {
	if x, ok := f.inner.(fs.FileIoctler); ok {
		return x.Ioctl(ctx, cmd, arg, input, output)
	}
	return 0, syscall.ENOTTY
}

func main() {
	backing := flag.String("backing", "", "the real directory the volume stores its files in")
	mountpoint := flag.String("mount", "", "where to mount the volume")
	writeBps := flag.Float64("write-bps", 0, "bytes per second of the volume's write pipe (0 = unthrottled)")
	readBps := flag.Float64("read-bps", 0, "bytes per second of the volume's read pipe (0 = unthrottled)")
	scale := flag.Float64("scale", 1, "each byte counts as this many bytes (small test state stands for a big one)")
	maxBacklog := flag.Float64("max-backlog-seconds", 2, "writes block while the write pipe is booked further ahead than this")
	flag.Parse()
	if *backing == "" || *mountpoint == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: slowfs --backing DIR --mount DIR [--write-bps N] [--read-bps N] [--scale F] [--max-backlog-seconds S]")
		os.Exit(2)
	}
	if *writeBps < 0 || *readBps < 0 || *scale <= 0 || *maxBacklog < 0 {
		fmt.Fprintln(os.Stderr, "slowfs: --write-bps/--read-bps/--max-backlog-seconds must be >= 0 and --scale > 0")
		os.Exit(2)
	}

	var st syscall.Stat_t
	if err := syscall.Stat(*backing, &st); err != nil {
		fmt.Fprintf(os.Stderr, "slowfs: backing %s: %v\n", *backing, err)
		os.Exit(1)
	}
	vol := &volume{
		write:      pipe{bps: *writeBps, scale: *scale},
		read:       pipe{bps: *readBps, scale: *scale},
		maxBacklog: time.Duration(*maxBacklog * float64(time.Second)),
	}
	rootData := &fs.LoopbackRoot{Path: *backing, Dev: uint64(st.Dev)}
	root := &slowNode{LoopbackNode: &fs.LoopbackNode{RootData: rootData}, vol: vol}
	rootData.RootNode = root

	// Short entry/attribute caching, so a rename by one process is seen by others promptly.
	sec := time.Second
	opts := &fs.Options{
		EntryTimeout: &sec,
		AttrTimeout:  &sec,
		MountOptions: fuse.MountOptions{
			DirectMount:       true,
			DirectMountStrict: true, // no fusermount here: mount(2) as root, or fail
			AllowOther:        true,
			FsName:            "slowfs",
			Name:              "slowfs",
			MaxWrite:          1 << 20,
		},
	}
	server, err := fs.Mount(*mountpoint, root, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "slowfs: mount %s: %v\n", *mountpoint, err)
		os.Exit(1)
	}
	fmt.Printf("slowfs: mounted %s (backing %s, write %.0f B/s, read %.0f B/s, scale %g, max backlog %gs)\n",
		*mountpoint, *backing, *writeBps, *readBps, *scale, *maxBacklog)
	os.Stdout.Sync()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	served := make(chan struct{})
	go func() { server.Wait(); close(served) }()
	select {
	case sig := <-sigs:
		fmt.Fprintf(os.Stderr, "slowfs: %v: unmounting %s\n", sig, *mountpoint)
	case <-served: // unmounted from outside (umount)
	}
	code := 0
	if err := server.Unmount(); err != nil {
		// Busy (a process still has a file or its cwd there): detach it, so the mountpoint is free;
		// those processes get errors from now on.
		fmt.Fprintf(os.Stderr, "slowfs: unmount %s: %v; detaching it (umount -l)\n", *mountpoint, err)
		if err := syscall.Unmount(*mountpoint, syscall.MNT_DETACH); err != nil {
			fmt.Fprintf(os.Stderr, "slowfs: umount -l %s: %v\n", *mountpoint, err)
		}
		code = 1
	}
	vol.write.mu.Lock()
	vol.read.mu.Lock()
	fmt.Fprintf(os.Stderr, "slowfs: wrote %d bytes, read %d bytes (real, before --scale)\n", vol.write.bytes, vol.read.bytes)
	os.Exit(code)
}
