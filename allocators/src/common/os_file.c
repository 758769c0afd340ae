/* os_file.c -- the OS primitives of files and file-backed memory: advice, fixed and shared mappings, residency, holes,
 * markers, the pool files' open, lock, size and sync, and the few process-wide calls (CPUs, membarrier, yield). */
#define _GNU_SOURCE
#include "common/os.h"
#include "common/uffd_abi.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#define TMPFS_MAGIC_ 0x01021994
#define RAMFS_MAGIC_ 0x858458f6

/* 0 when rc is 0, else -errno with the caller's errno put back */
static int result(int rc, int saved)
{
    int e = rc == 0 ? 0 : -errno;
    errno = saved;
    return e;
}

long rtk_os_pid(void) { return (long)getpid(); }

int rtk_os_advise(void *p, size_t size, int advice)
{
    static const int native[] = {0, MADV_RANDOM, MADV_REMOVE, MADV_PAGEOUT, MADV_COLD, MADV_NOHUGEPAGE};
    if (advice <= 0 || advice >= (int)(sizeof native / sizeof native[0]))
        return -EINVAL;
    int saved = errno;
    return result(madvise(p, size, native[advice]), saved);
}

int rtk_os_map_file_at(void *at, size_t size, int fd, uint64_t off, int shared)
{
    /* Mapped elsewhere first, then moved over `at` in one step: a MAP_FIXED mmap that fails after it unmapped what
     * was there (older kernels check a private mapping's commit charge only then) would leave a hole where a table
     * lives; a failed mmap elsewhere leaves everything as it was, and the move itself takes no new charge. */
    int saved = errno;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, shared ? MAP_SHARED : MAP_PRIVATE, fd, (off_t)off);
    if (p == MAP_FAILED)
        return result(-1, saved);
    if (mremap(p, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, at) == MAP_FAILED) {
        int rc = result(-1, saved);
        munmap(p, size);
        return rc;
    }
    errno = saved;
    return 0;
}

int rtk_os_resident(void *p, size_t size, unsigned char *vec)
{
    int saved = errno;
    return result(mincore(p, size, vec), saved);
}

int rtk_os_open_rw(const char *path)
{
    int saved = errno;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    return fd >= 0 ? (errno = saved, fd) : result(-1, saved);
}

int rtk_os_open_ro(const char *path)
{
    int saved = errno;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    return fd >= 0 ? (errno = saved, fd) : result(-1, saved);
}

void rtk_os_close(int fd)
{
    int saved = errno;
    close(fd);
    errno = saved;
}

int rtk_os_unlink(const char *path)
{
    int saved = errno;
    return result(unlink(path), saved);
}

int rtk_os_create_marker(const char *path)
{
    int saved = errno;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0)
        return result(-1, saved);
    close(fd);
    errno = saved;
    return 0;
}

int rtk_os_path_probe(const char *path)
{
    int saved = errno;
    struct stat st;
    if (lstat(path, &st) != 0) {
        errno = saved;
        return RTK_PATH_ABSENT;
    }
    int fd = S_ISREG(st.st_mode) ? open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) : -1;
    int locked = fd >= 0 && flock(fd, LOCK_SH | LOCK_NB) != 0;
    if (fd >= 0)
        close(fd);
    errno = saved;
    return locked ? RTK_PATH_LOCKED : RTK_PATH_PRESENT;
}

int rtk_os_on_ram_fs(const char *path)
{
    int saved = errno;
    struct statfs sf;
    int ram = statfs(path, &sf) == 0 && (sf.f_type == TMPFS_MAGIC_ || sf.f_type == RAMFS_MAGIC_);
    errno = saved;
    return ram;
}

int rtk_os_watch_open(rtk_os_watch_t *w)
{
    int saved = errno, rc = 0;
    w->uffd = w->pagemap = -1;
#ifdef SYS_userfaultfd
    /* user-mode faults only: what an unprivileged process may ask for (vm.unprivileged_userfaultfd = 0) */
    w->uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY_);
    if (w->uffd < 0)
        return result(-1, saved);
    struct uffdio_api_ api = {UFFD_API_, UFFD_FEATURE_WP_ASYNC_, 0};
    if (ioctl(w->uffd, UFFDIO_API_, &api) != 0)
        rc = -errno;
    else if (!(api.features & UFFD_FEATURE_WP_ASYNC_))
        rc = -EINVAL;
    if (rc == 0) {
        w->pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
        if (w->pagemap < 0)
            rc = -errno;
    }
#else
    rc = -ENOSYS;
#endif
    if (rc != 0)
        rtk_os_watch_close(w);
    errno = saved;
    return rc;
}

int rtk_os_watch_add(const rtk_os_watch_t *w, void *p, size_t size)
{
    int saved = errno;
    struct uffdio_register_ r = {(uint64_t)(uintptr_t)p, size, UFFDIO_REGISTER_MODE_WP_, 0};
    return result(ioctl(w->uffd, UFFDIO_REGISTER_, &r), saved);
}

long rtk_os_watch_scan(const rtk_os_watch_t *w, void *lo, void *hi, rtk_os_region_t *out, long cap, int strict,
                       uintptr_t *walk_end)
{
    int saved = errno;
    struct pm_scan_arg_ a = {sizeof a, PM_SCAN_WP_MATCHING_ | (strict ? PM_SCAN_CHECK_WPASYNC_ : 0), (uint64_t)(uintptr_t)lo,
                             (uint64_t)(uintptr_t)hi, 0, (uint64_t)(uintptr_t)out, (uint64_t)cap, 0, 0,
                             PAGE_IS_WRITTEN_, 0, PAGE_IS_WRITTEN_};
    long n = ioctl(w->pagemap, PAGEMAP_SCAN_, &a);
    if (n < 0) {
        n = -errno;
        errno = saved;
        return n;
    }
    *walk_end = (uintptr_t)a.walk_end;
    return n;
}

int rtk_os_pagemap_open(void)
{
    int saved = errno, fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    return fd >= 0 ? (errno = saved, fd) : result(-1, saved);
}

long long rtk_os_private_bytes(int fd, void *p, size_t size)
{
    int saved = errno;
    rtk_os_region_t out[64];
    long long bytes = 0;
    uint64_t lo = (uint64_t)(uintptr_t)p, hi = lo + size;
    while (lo < hi) {
        /* present and not a page of the file: a page the process wrote through a private mapping (copy on write) */
        struct pm_scan_arg_ a = {sizeof a, 0, lo, hi, 0, (uint64_t)(uintptr_t)out, 64, 0, PAGE_IS_FILE_,
                                 PAGE_IS_FILE_ | PAGE_IS_PRESENT_, 0, PAGE_IS_PRESENT_};
        long n = ioctl(fd, PAGEMAP_SCAN_, &a);
        if (n < 0) {
            bytes = -errno;
            break;
        }
        for (long i = 0; i < n; i++)
            bytes += (long long)(out[i].end - out[i].start);
        if (a.walk_end <= lo)
            break;
        lo = a.walk_end;
    }
    errno = saved;
    return bytes;
}

void rtk_os_watch_close(rtk_os_watch_t *w)
{
    int saved = errno;
    if (w->uffd >= 0)
        close(w->uffd);
    if (w->pagemap >= 0)
        close(w->pagemap);
    w->uffd = w->pagemap = -1;
    errno = saved;
}

int rtk_os_write_back(int fd, uint64_t off, uint64_t size)
{
    int saved = errno;
    return result(sync_file_range(fd, (off64_t)off, (off64_t)size,
                                  SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER),
                  saved);
}

int rtk_os_drop_cached(int fd, uint64_t off, uint64_t size)
{
    return -posix_fadvise(fd, (off_t)off, (off_t)size, POSIX_FADV_DONTNEED);  /* errno untouched: it returns it */
}

int rtk_os_read_soon(int fd, uint64_t off, uint64_t size)
{
    return -posix_fadvise(fd, (off_t)off, (off_t)size, POSIX_FADV_WILLNEED);
}

long rtk_os_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n;
}

uint64_t rtk_os_phys_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

int rtk_os_map_shared(int fd, size_t size, int writable, void **out)
{
    int saved = errno;
    int prot = PROT_READ | (writable ? PROT_WRITE : 0);
    void *p = mmap(NULL, size, prot, MAP_SHARED | MAP_NORESERVE, fd, 0);
    *out = p == MAP_FAILED ? NULL : p;
    return result(p == MAP_FAILED ? -1 : 0, saved);
}

int rtk_os_sync_range(void *p, size_t size)
{
    int saved = errno;
    return result(msync(p, size, MS_SYNC), saved);
}

int rtk_os_create_excl(const char *path)
{
    int saved = errno;
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    return fd >= 0 ? (errno = saved, fd) : result(-1, saved);
}

int rtk_os_open_nonblock(const char *path, int writable)
{
    int saved = errno;
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_NONBLOCK | O_CLOEXEC);
    return fd >= 0 ? (errno = saved, fd) : result(-1, saved);
}

int rtk_os_lock(int fd, int exclusive)
{
    int saved = errno;
    return result(flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB), saved);
}

int rtk_os_allocate(int fd, uint64_t size)
{
    int saved = errno;
    int e = posix_fallocate(fd, 0, (off_t)size);  /* returns the error, leaves errno alone */
    if (e == EOPNOTSUPP || e == EINVAL)
        e = ftruncate(fd, (off_t)size) ? errno : 0;
    errno = saved;
    return -e;
}

int rtk_os_file_info(int fd, rtk_file_info_t *out)
{
    int saved = errno;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return result(-1, saved);
    out->dev = (uint64_t)st.st_dev;
    out->ino = (uint64_t)st.st_ino;
    out->size = (uint64_t)st.st_size;
    out->regular = S_ISREG(st.st_mode);
    return 0;
}

int rtk_os_fd_on_ram_fs(int fd)
{
    int saved = errno;
    struct statfs sf;
    int ram = fstatfs(fd, &sf) == 0 && (sf.f_type == TMPFS_MAGIC_ || sf.f_type == RAMFS_MAGIC_);
    errno = saved;
    return ram;
}

long rtk_os_write_at(int fd, const void *buf, size_t len, uint64_t off)
{
    int saved = errno;
    ssize_t n = pwrite(fd, buf, len, (off_t)off);
    return n >= 0 ? (errno = saved, (long)n) : result(-1, saved);
}

long long rtk_os_seek_data(int fd, uint64_t off, int hole)
{
    int saved = errno;
    off_t at = lseek(fd, (off_t)off, hole ? SEEK_HOLE : SEEK_DATA);
    return at >= 0 ? (errno = saved, (long long)at) : result(-1, saved);
}

int rtk_os_uffd_open(uint64_t features, int nonblock)
{
#ifdef SYS_userfaultfd
    int saved = errno;
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | (nonblock ? O_NONBLOCK : 0) | UFFD_USER_MODE_ONLY_);
    if (fd < 0)
        return result(-1, saved);
    struct uffdio_api_ api = {UFFD_API_, features, 0};
    int rc = ioctl(fd, UFFDIO_API_, &api) == 0 ? 0 : -errno;
    if (rc == 0 && (api.features & features) != features)
        rc = -EOPNOTSUPP;
    if (rc != 0)
        close(fd);
    errno = saved;
    return rc != 0 ? rc : fd;
#else
    (void)features, (void)nonblock;
    return -ENOSYS;
#endif
}

int rtk_os_uffd_call(int fd, unsigned long request, void *arg)
{
    int saved = errno;
    return result(ioctl(fd, request, arg), saved);
}

long rtk_os_pagemap_scan(int pagemap, void *arg)
{
    int saved = errno;
    long n = ioctl(pagemap, PAGEMAP_SCAN_, arg);
    if (n < 0)
        n = -errno;
    errno = saved;
    return n;
}

int rtk_os_uffd_wait_read(int fd, void *msg, size_t len)
{
    int saved = errno;
    struct pollfd pf = {fd, POLLIN, 0};
    int got = poll(&pf, 1, -1) > 0 && read(fd, msg, len) == (ssize_t)len;
    errno = saved;
    return got;
}

int rtk_os_map_registered_over(void *at, size_t len, int uffd, uint64_t mode)
{
    int saved = errno;
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return result(-1, saved);
    madvise(m, len, MADV_NOHUGEPAGE);
    struct uffdio_register_ reg = {(uint64_t)(uintptr_t)m, len, mode, 0};
    int rc = ioctl(uffd, UFFDIO_REGISTER_, &reg) == 0 ? 0 : -errno;
    if (rc == 0 && mremap(m, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, at) != at)
        rc = -errno;
    if (rc != 0)
        munmap(m, len);
    errno = saved;
    return rc;
}

long rtk_os_read_at(int fd, void *buf, size_t len, uint64_t off)
{
    int saved = errno;
    ssize_t n = pread(fd, buf, len, (off_t)off);
    return n >= 0 ? (errno = saved, (long)n) : result(-1, saved);
}

int rtk_os_random(void *buf, size_t len)
{
    int saved = errno;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return result(-1, saved);
    ssize_t n = read(fd, buf, len);
    close(fd);
    errno = saved;
    return n == (ssize_t)len ? 0 : -EIO;
}

long rtk_os_membarrier(int cmd)
{
#ifdef SYS_membarrier
    return syscall(SYS_membarrier, cmd, 0, 0);
#else
    (void)cmd;
    errno = ENOSYS;
    return -1;
#endif
}

void rtk_os_yield(void) { sched_yield(); }
