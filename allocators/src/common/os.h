/* os.h -- the OS primitive layer of the native libraries: mappings, madvise, page-fault counters, clocks, files. */
#ifndef RTK_COMMON_OS_H
#define RTK_COMMON_OS_H

#include <stddef.h>
#include <stdint.h>

#include "common/log.h"

enum {
    RTK_MAP_POPULATE = 1,  /* fault every page in now (after THP advice, so huge pages are used when allowed) */
    RTK_MAP_HUGEPAGE = 2,  /* madvise(MADV_HUGEPAGE); the mapping is then aligned to 2 MiB */
};

RTK_HIDDEN size_t rtk_os_page_size(void);
/* Anonymous private read/write mapping of `size` bytes (rounded up to pages), NULL on failure. */
RTK_HIDDEN void *rtk_os_map(size_t size, int flags);
RTK_HIDDEN int rtk_os_unmap(void *p, size_t size);
RTK_HIDDEN int rtk_os_hugepage(void *p, size_t size);
/* Fault pages in for writing (MADV_POPULATE_WRITE when the kernel has it, else touch one byte per page). */
RTK_HIDDEN void rtk_os_populate(void *p, size_t size);
/* Address space only (MAP_NORESERVE): pages cost memory once touched. hint: a preferred address (0: any);
 * the kernel places it elsewhere when that range is taken. NULL on failure. */
RTK_HIDDEN void *rtk_os_reserve(size_t size, uintptr_t hint);
/* Map `size` bytes of address space (as rtk_os_reserve) exactly at addr, never over an existing mapping: 0 done, -1
 * when the range is taken (by anything) or the address space limit refuses it. */
RTK_HIDDEN int rtk_os_reserve_at(void *addr, size_t size);
/* Give pages back (MADV_DONTNEED): the range stays mapped and reads as zero when touched again. */
RTK_HIDDEN int rtk_os_release(void *p, size_t size);
/* RLIMIT_AS (SIZE_MAX when unlimited), and MemAvailable from /proc/meminfo (SIZE_MAX when unknown). */
RTK_HIDDEN size_t rtk_os_as_limit(void);
RTK_HIDDEN size_t rtk_os_mem_available(void);
/* Minor (and major) page faults of the whole process so far (getrusage RUSAGE_SELF). */
RTK_HIDDEN uint64_t rtk_os_minor_faults(void);
RTK_HIDDEN uint64_t rtk_os_major_faults(void);
/* Monotonic clock in nanoseconds. */
RTK_HIDDEN uint64_t rtk_os_now_ns(void);
/* CPU time of the calling thread in nanoseconds (what a background thread costs the job, not its waits). */
RTK_HIDDEN uint64_t rtk_os_thread_cpu_ns(void);
/* Wall clock: whole seconds since the epoch (a pool header's creation time). */
RTK_HIDDEN uint64_t rtk_os_unix_s(void);
/* Write `len` bytes to `path` atomically: a fresh "<path>.tmp.<pid>.<n>" (O_EXCL|O_NOFOLLOW, mode 0666 & ~umask),
 * fsync-free, then rename. 0 or -errno. */
RTK_HIDDEN int rtk_os_write_file_atomic(const char *path, const void *buf, size_t len);
/* Bytes written through rtk_os_write_file_atomic by this process so far; _forget zeroes it in a forked child, whose
 * disk writes the kernel counts from zero too. */
RTK_HIDDEN uint64_t rtk_os_files_written_bytes(void);
RTK_HIDDEN void rtk_os_files_written_forget(void);
/* Count bytes a run file got written other than through rtk_os_write_file_atomic (an appended record: the pages it
 * began). Both counts are in whole pages, as the kernel's (/proc/PID/io write_bytes counts the pages dirtied). */
RTK_HIDDEN void rtk_os_files_written_add(uint64_t len);
/* The device and inode of the regular file at path (not followed if a link): 0, or -1 when it is none. */
RTK_HIDDEN int rtk_os_file_id(const char *path, uint64_t *dev, uint64_t *ino);
/* Append len bytes to path only if it is still the regular file (dev, ino) names (O_APPEND|O_NOFOLLOW: a file or link
 * put in its place is never written): the bytes written (short on a write error), -1 when it is not that file or
 * cannot be opened. *size_before: the file's size before (the pages an append begins are what the kernel counts). */
RTK_HIDDEN long rtk_os_append_file(const char *path, uint64_t dev, uint64_t ino, const void *buf, size_t len,
                                   uint64_t *size_before);
/* Read a whole small regular file into buf (NUL-terminated), never blocking. Returns bytes read or -errno:
 * -EFBIG when it does not fit, -EISDIR, -RTK_READ_ENOTREG (FIFO, device...), -RTK_READ_ELINK (a symbolic link
 * with RTK_READ_NOFOLLOW). rtk_os_read_error() words any of them. */
#define RTK_READ_NOFOLLOW 1
#define RTK_READ_ENOTREG 4001
#define RTK_READ_ELINK 4002
RTK_HIDDEN long rtk_os_read_file(const char *path, char *buf, size_t cap);
RTK_HIDDEN long rtk_os_read_file_flags(const char *path, char *buf, size_t cap, int flags);
RTK_HIDDEN const char *rtk_os_read_error(long err);

/* ---- primitives of file-backed memory (the tier pool): each wraps one system call, keeps errno as the caller
 * had it, and returns 0 or -errno unless it says otherwise */
RTK_HIDDEN long rtk_os_pid(void);
/* Advice over [p, p + size): how the kernel should treat those pages. */
enum {
    RTK_ADVISE_RANDOM = 1,  /* no read-ahead */
    RTK_ADVISE_REMOVE,      /* free the backing store (a hole in a file mapping; the range reads as zero) */
    RTK_ADVISE_PAGEOUT,     /* write out and reclaim now */
    RTK_ADVISE_COLD,        /* reclaim these first under pressure */
    RTK_ADVISE_NOHUGEPAGE,  /* 4 KiB pages only (a pager moves and ages pages one by one) */
};
RTK_HIDDEN int rtk_os_advise(void *p, size_t size, int advice);
/* Map fd's [off, off + size) at exactly `at` (over what is there, in one step; on failure what was there stays):
 * shared (writes reach the file) or private. */
RTK_HIDDEN int rtk_os_map_file_at(void *at, size_t size, int fd, uint64_t off, int shared);
/* Which of the pages of [p, p + size) are in memory: one byte per page in vec, bit 0 set when resident. */
RTK_HIDDEN int rtk_os_resident(void *p, size_t size, unsigned char *vec);
RTK_HIDDEN int rtk_os_open_rw(const char *path);
RTK_HIDDEN int rtk_os_open_ro(const char *path);
RTK_HIDDEN void rtk_os_close(int fd);
RTK_HIDDEN int rtk_os_unlink(const char *path);
/* Create `path` (O_EXCL|O_NOFOLLOW, empty) as a marker: 0 when this call made it, -EEXIST when it was there. */
RTK_HIDDEN int rtk_os_create_marker(const char *path);
/* What sits at `path`: RTK_PATH_ABSENT (nothing, or unreachable), RTK_PATH_LOCKED (a regular file another
 * process holds a flock on), RTK_PATH_PRESENT (anything else). Never blocks, never follows a link. */
enum { RTK_PATH_ABSENT = 0, RTK_PATH_LOCKED, RTK_PATH_PRESENT };
RTK_HIDDEN int rtk_os_path_probe(const char *path);
/* 1 when path lies on a RAM file system (tmpfs, ramfs), else 0. */
RTK_HIDDEN int rtk_os_on_ram_fs(const char *path);
/* Write fd's dirty pages in [off, off + size) and wait for them. */
RTK_HIDDEN int rtk_os_write_back(int fd, uint64_t off, uint64_t size);
/* Drop fd's clean cached pages in [off, off + size) that no process maps (POSIX_FADV_DONTNEED): the pages of a
 * shared mapping that this process no longer maps (MADV_PAGEOUT cannot see them) but another one read in. */
RTK_HIDDEN int rtk_os_drop_cached(int fd, uint64_t off, uint64_t size);
/* Start reading fd's [off, off + size) into the page cache and return at once (POSIX_FADV_WILLNEED): many runs are
 * then read together, where one pread after another would wait for each. */
RTK_HIDDEN int rtk_os_read_soon(int fd, uint64_t off, uint64_t size);
/* Which pages were written, range by range, without a write-protect fault anywhere else in the process: a
 * userfaultfd in asynchronous write-protect mode (the kernel resolves each first write itself, no thread waits)
 * over the watched ranges, read and re-armed with the PAGEMAP_SCAN ioctl of /proc/self/pagemap (Linux >= 6.7).
 * Both descriptors are close-on-exec; /proc/self/pagemap reads the mm of the process that opened it, so a
 * forked child must close them. */
typedef struct { int uffd, pagemap; } rtk_os_watch_t;
typedef struct { uint64_t start, end, flags; } rtk_os_region_t;  /* the kernel's struct page_region */
/* Open both descriptors: 0, or -errno (-ENOSYS, -EPERM, -EINVAL: the kernel lacks the mechanism). */
RTK_HIDDEN int rtk_os_watch_open(rtk_os_watch_t *w);
/* Watch [p, p + size) (whole mappings or parts of them, of any kind): 0 or -errno. */
RTK_HIDDEN int rtk_os_watch_add(const rtk_os_watch_t *w, void *p, size_t size);
/* The ranges of [lo, hi) written since the last scan, at most cap of them into out, each write-protected again:
 * how many, or -errno. strict: -EPERM where a mapping in the range is not watched (else it is skipped).
 * *walk_end: where the scan stopped (hi, unless out filled first). */
RTK_HIDDEN long rtk_os_watch_scan(const rtk_os_watch_t *w, void *lo, void *hi, rtk_os_region_t *out, long cap,
                                  int strict, uintptr_t *walk_end);
RTK_HIDDEN void rtk_os_watch_close(rtk_os_watch_t *w);
/* /proc/self/pagemap, read-only (close with rtk_os_close): the fd or -errno. */
RTK_HIDDEN int rtk_os_pagemap_open(void);
/* tier_pager's kernel interface (userfaultfd, common/uffd_abi.h). uffd_open: a userfaultfd of user-mode faults with
 * every feature in `features` (-EOPNOTSUPP where one is missing), nonblocking or not: its descriptor or -errno;
 * uffd_call: an ioctl on it (UFFDIO_*): 0 or -errno; uffd_wait_read: block
 * until the descriptor is readable, then read one message of `len` bytes (1, or 0 when another reader took it);
 * map_registered_over: an anonymous 4 KiB-page mapping of len bytes registered with `uffd` in `mode`, moved over
 * [at, at + len) in one step (0, or -errno with nothing changed there); write_at: pwrite; seek_data: the next data
 * (hole = 0) or hole (hole = 1) of fd at or after off, or -errno (-ENXIO: no more data). */
RTK_HIDDEN int rtk_os_uffd_open(uint64_t features, int nonblock);
RTK_HIDDEN int rtk_os_uffd_call(int fd, unsigned long request, void *arg);
RTK_HIDDEN long rtk_os_pagemap_scan(int pagemap, void *arg);  /* PAGEMAP_SCAN: the regions filled, or -errno */
RTK_HIDDEN int rtk_os_uffd_wait_read(int fd, void *msg, size_t len);
RTK_HIDDEN int rtk_os_map_registered_over(void *at, size_t len, int uffd, uint64_t mode);
RTK_HIDDEN long rtk_os_write_at(int fd, const void *buf, size_t len, uint64_t off);
RTK_HIDDEN long long rtk_os_seek_data(int fd, uint64_t off, int hole);
/* The bytes of [p, p + size) held in the process's own anonymous pages (a private file mapping's pages once
 * written: copies on write), by PAGEMAP_SCAN (Linux >= 6.7) on `pagemap`; -errno where the kernel cannot tell. */
RTK_HIDDEN long long rtk_os_private_bytes(int pagemap, void *p, size_t size);

/* ---- primitives of the PMEM pool's files (same conventions: errno kept, 0 or -errno unless said otherwise) */
/* Online CPUs (at least 1). */
RTK_HIDDEN long rtk_os_cpu_count(void);
/* Physical memory in bytes (0 when unknown). */
RTK_HIDDEN uint64_t rtk_os_phys_bytes(void);
/* Map fd's first `size` bytes shared (writes reach the file; no swap reserved), read-only unless writable. */
RTK_HIDDEN int rtk_os_map_shared(int fd, size_t size, int writable, void **out);
/* Write [p, p + size) of a shared file mapping back to its file and wait (msync MS_SYNC). */
RTK_HIDDEN int rtk_os_sync_range(void *p, size_t size);
/* Create `path` as a new file (O_EXCL|O_NOFOLLOW, mode 0666 & ~umask), read/write: the fd or -errno. */
RTK_HIDDEN int rtk_os_create_excl(const char *path);
/* Open an existing file without blocking (a FIFO or device never blocks): the fd or -errno. */
RTK_HIDDEN int rtk_os_open_nonblock(const char *path, int writable);
/* A non-blocking flock: 0, -EWOULDBLOCK when another open file holds it, other -errno. */
RTK_HIDDEN int rtk_os_lock(int fd, int exclusive);
/* Give fd `size` bytes of blocks (posix_fallocate; ftruncate where the file system cannot allocate). */
RTK_HIDDEN int rtk_os_allocate(int fd, uint64_t size);
typedef struct { uint64_t dev, ino, size; int regular; } rtk_file_info_t;
RTK_HIDDEN int rtk_os_file_info(int fd, rtk_file_info_t *out);
/* 1 when fd's file lies on a RAM file system (tmpfs, ramfs), else 0. */
RTK_HIDDEN int rtk_os_fd_on_ram_fs(int fd);
/* Read `len` bytes at `off`: the bytes read or -errno. */
RTK_HIDDEN long rtk_os_read_at(int fd, void *buf, size_t len, uint64_t off);
/* `len` random bytes from the kernel (/dev/urandom). */
RTK_HIDDEN int rtk_os_random(void *buf, size_t len);
/* membarrier(2) with flags 0: the kernel's answer, -1 with errno kept where it has none. */
RTK_HIDDEN long rtk_os_membarrier(int cmd);
RTK_HIDDEN void rtk_os_yield(void);
/* A thread of the library's own: fn(arg) on a stack of `stack` bytes, every signal blocked (the program's handlers
 * never run on it), joinable. 0 and its id in *out, or -errno. join: wait for it to end. */
RTK_HIDDEN int rtk_os_thread_start(void *(*fn)(void *), void *arg, size_t stack, unsigned long *out);
RTK_HIDDEN int rtk_os_thread_join(unsigned long thread);
/* Sleep while *word == value (a process-private futex; returns on a wake, a signal or a changed word), and wake
 * every sleeper on word. */
RTK_HIDDEN void rtk_os_futex_wait(uint32_t *word, uint32_t value);
RTK_HIDDEN void rtk_os_futex_wake(uint32_t *word);

#endif
