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
/* Write `len` bytes to `path` atomically: a fresh "<path>.tmp.<pid>.<n>" (O_EXCL|O_NOFOLLOW, mode 0666 & ~umask),
 * fsync-free, then rename. 0 or -errno. */
RTK_HIDDEN int rtk_os_write_file_atomic(const char *path, const void *buf, size_t len);
/* Read a whole small regular file into buf (NUL-terminated), never blocking. Returns bytes read or -errno:
 * -EFBIG when it does not fit, -EISDIR, -RTK_READ_ENOTREG (FIFO, device...), -RTK_READ_ELINK (a symbolic link
 * with RTK_READ_NOFOLLOW). rtk_os_read_error() words any of them. */
#define RTK_READ_NOFOLLOW 1
#define RTK_READ_ENOTREG 4001
#define RTK_READ_ELINK 4002
RTK_HIDDEN long rtk_os_read_file(const char *path, char *buf, size_t cap);
RTK_HIDDEN long rtk_os_read_file_flags(const char *path, char *buf, size_t cap, int flags);
RTK_HIDDEN const char *rtk_os_read_error(long err);

#endif
