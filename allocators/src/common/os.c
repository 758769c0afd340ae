/* os.c -- mmap/madvise wrappers, fault counters, clock, atomic file writes, the library's own thread and futex (no stdio). */
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define RTK_HUGE_ALIGN ((size_t)2 << 20)

size_t rtk_os_page_size(void)
{
    static size_t page;
    if (!page) {
        long p = sysconf(_SC_PAGESIZE);
        page = p > 0 ? (size_t)p : 4096;
    }
    return page;
}

void *rtk_os_map(size_t size, int flags)
{
    size_t page = rtk_os_page_size();
    size = (size + page - 1) & ~(page - 1);
    if (size == 0)
        return NULL;
    if (!(flags & RTK_MAP_HUGEPAGE)) {
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
        if (flags & RTK_MAP_POPULATE)
            rtk_os_populate(p, size);
        return p;
    }
    /* over-reserve so the usable range starts on a huge-page boundary, then trim both ends */
    size_t span = size + RTK_HUGE_ALIGN;
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    char *start = (char *)(((uintptr_t)raw + RTK_HUGE_ALIGN - 1) & ~(uintptr_t)(RTK_HUGE_ALIGN - 1));
    if (start > raw)
        munmap(raw, (size_t)(start - raw));
    char *end = start + size;
    if (raw + span > end)
        munmap(end, (size_t)(raw + span - end));
    rtk_os_hugepage(start, size);
    if (flags & RTK_MAP_POPULATE)
        rtk_os_populate(start, size);
    return start;
}

int rtk_os_unmap(void *p, size_t size)
{
    size_t page = rtk_os_page_size();
    size = (size + page - 1) & ~(page - 1);
    return p ? munmap(p, size) : 0;
}

int rtk_os_hugepage(void *p, size_t size)
{
#ifdef MADV_HUGEPAGE
    return madvise(p, size, MADV_HUGEPAGE);
#else
    (void)p; (void)size;
    return -1;
#endif
}

void rtk_os_populate(void *p, size_t size)
{
    int saved = errno;
    if (madvise(p, size, MADV_POPULATE_WRITE) != 0) {
        size_t page = rtk_os_page_size();
        volatile char *c = p;
        for (size_t off = 0; off < size; off += page)
            c[off] = c[off];  /* a write fault that keeps the contents (a debug poison, a block's data) */
    }
    errno = saved;
}

uint64_t rtk_os_minor_faults(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (uint64_t)ru.ru_minflt;
}

uint64_t rtk_os_major_faults(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (uint64_t)ru.ru_majflt;
}

uint64_t rtk_os_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t rtk_os_thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t rtk_os_unix_s(void)
{
    return (uint64_t)time(NULL);
}

/* Safety rule (docs/safety.md): every file the C libraries write is created fresh with O_EXCL|O_NOFOLLOW under a
 * name no one else uses, then renamed over the target. A link planted at the temporary's name (a shared run
 * directory) makes the create fail instead of writing through it; mode 0666 leaves the permissions to the umask. */
/* bytes this process wrote through rtk_os_write_file_atomic: its own run files are part of the child's disk writes
 * (/proc/PID/io), which the report otherwise lays at the pool's door */
static uint64_t g_files_written;

uint64_t rtk_os_files_written_bytes(void)
{
    return __atomic_load_n(&g_files_written, __ATOMIC_RELAXED);
}

void rtk_os_files_written_forget(void)
{
    __atomic_store_n(&g_files_written, 0, __ATOMIC_RELAXED);
}

void rtk_os_files_written_add(uint64_t len)
{
    __atomic_add_fetch(&g_files_written, len, __ATOMIC_RELAXED);
}

int rtk_os_file_id(const char *path, uint64_t *dev, uint64_t *ino)
{
    struct stat st;
    int saved = errno;
    int r = lstat(path, &st) == 0 && S_ISREG(st.st_mode) ? 0 : -1;
    errno = saved;
    *dev = r ? 0 : (uint64_t)st.st_dev;
    *ino = r ? 0 : (uint64_t)st.st_ino;
    return r;
}

long rtk_os_append_file(const char *path, uint64_t dev, uint64_t ino, const void *buf, size_t len, uint64_t *size_before)
{
    int saved = errno;
    int fd = open(path, O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_dev != dev || (uint64_t)st.st_ino != ino)) {
        close(fd);
        fd = -1;
    }
    if (fd < 0) {
        errno = saved;
        return -1;
    }
    *size_before = (uint64_t)st.st_size;
    const char *c = buf;
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, c + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    close(fd);
    errno = saved;
    return (long)off;
}

int rtk_os_write_file_atomic(const char *path, const void *buf, size_t len)
{
    static unsigned counter;
    char tmp[4096 + 64];
    int saved = errno;
    int fd = -1;
    for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
        unsigned k = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
        int n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), k);
        if (n < 0 || (size_t)n >= sizeof tmp)
            return -ENAMETOOLONG;
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        int e = errno;
        errno = saved;
        return -e;
    }
    const char *c = buf;
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, c + off, len - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            close(fd);
            unlink(tmp);
            errno = saved;
            return -e;
        }
        off += (size_t)w;
    }
    /* in whole pages, as the kernel counts the writes of a fresh file (a 1.3 KB file costs a 4 KiB page) */
    __atomic_add_fetch(&g_files_written, ((uint64_t)len + 4095) / 4096 * 4096, __ATOMIC_RELAXED);
    close(fd);
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        errno = saved;
        return -e;
    }
    errno = saved;
    return 0;
}

/* Safety rule: an input file is read only if it is a regular file, without blocking (O_NONBLOCK: a FIFO or a
 * device never stalls the job) and at most cap - 1 bytes (its size is checked before a byte is read). */
long rtk_os_read_file_flags(const char *path, char *buf, size_t cap, int flags)
{
    int saved = errno;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | ((flags & RTK_READ_NOFOLLOW) ? O_NOFOLLOW : 0));
    if (fd < 0) {
        int e = errno;
        errno = saved;
        return e == ELOOP ? -RTK_READ_ELINK : -e;
    }
    struct stat st;
    memset(&st, 0, sizeof st);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int dir = S_ISDIR(st.st_mode);
        close(fd);
        errno = saved;
        return dir ? -EISDIR : -RTK_READ_ENOTREG;
    }
    if (st.st_size >= 0 && (size_t)st.st_size >= cap) {
        close(fd);
        errno = saved;
        return -EFBIG;
    }
    size_t off = 0;
    for (;;) {
        if (off + 1 >= cap) {
            close(fd);
            errno = saved;
            return -EFBIG;
        }
        ssize_t r = read(fd, buf + off, cap - 1 - off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            close(fd);
            errno = saved;
            return -e;
        }
        if (r == 0)
            break;
        off += (size_t)r;
    }
    close(fd);
    buf[off] = 0;
    errno = saved;
    return (long)off;
}

void *rtk_os_reserve(size_t size, uintptr_t hint)
{
    void *p = mmap((void *)hint, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

int rtk_os_reserve_at(void *addr, size_t size)
{
    int saved = errno;
    /* a kernel without MAP_FIXED_NOREPLACE takes addr as a hint: a mapping placed elsewhere is undone */
    void *p = mmap(addr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
                   -1, 0);
    if (p != MAP_FAILED && p != addr)
        munmap(p, size);
    errno = saved;
    return p == addr ? 0 : -1;
}

int rtk_os_release(void *p, size_t size)
{
    int saved = errno;
    int r = madvise(p, size, MADV_DONTNEED);
    errno = saved;
    return r;
}

size_t rtk_os_as_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return SIZE_MAX;
    return (size_t)rl.rlim_cur;
}

size_t rtk_os_mem_available(void)
{
    char buf[4096];
    long n = rtk_os_read_file("/proc/meminfo", buf, sizeof buf);
    if (n <= 0)
        return SIZE_MAX;
    const char *s = strstr(buf, "MemAvailable:");
    if (!s)
        return SIZE_MAX;
    unsigned long long kib = 0;
    for (s += 13; *s == ' '; s++)
        ;
    for (; *s >= '0' && *s <= '9'; s++)
        kib = kib * 10 + (unsigned long long)(*s - '0');
    return (size_t)kib << 10;
}

long rtk_os_read_file(const char *path, char *buf, size_t cap) { return rtk_os_read_file_flags(path, buf, cap, 0); }

const char *rtk_os_read_error(long err)
{
    switch ((int)-err) {
    case RTK_READ_ENOTREG: return "not a regular file (a FIFO, device or socket is never read)";
    case RTK_READ_ELINK: return "is a symbolic link (give the file itself)";
    case EISDIR: return "is a directory, not a plan file";
    case EFBIG: return "too large for a plan file";
    default: return strerror((int)-err);
    }
}

int rtk_os_thread_start(void *(*fn)(void *), void *arg, size_t stack, unsigned long *out)
{
    int saved = errno;
    pthread_attr_t attr;
    sigset_t all, old;
    if (pthread_attr_init(&attr) != 0)
        return -EAGAIN;
    pthread_attr_setstacksize(&attr, stack);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);  /* the new thread inherits the blocked set */
    pthread_t t;
    int rc = pthread_create(&t, &attr, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    errno = saved;
    if (rc != 0)
        return -rc;
    *out = (unsigned long)t;
    return 0;
}

int rtk_os_thread_join(unsigned long thread) { return -pthread_join((pthread_t)thread, NULL); }

void rtk_os_futex_wait(uint32_t *word, uint32_t value)
{
    int saved = errno;
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, value, NULL, NULL, 0);
    errno = saved;
}

void rtk_os_futex_wake(uint32_t *word)
{
    int saved = errno;
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
    errno = saved;
}
