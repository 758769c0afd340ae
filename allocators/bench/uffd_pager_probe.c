/* uffd_pager_probe.c -- can tier mode page a pool's tail itself? userfaultfd on anonymous memory, checked on this
 * kernel: missing and synchronous write-protect faults in one context, the registration kept when the registered
 * mapping is moved over a table (mremap, UFFD_FEATURE_EVENT_REMAP), and what each kind of fault costs a thread
 * against a plain anonymous first touch. Not a test, not run by the suite (docs/pmem.md, "Full scale").
 * Usage: uffd_pager_probe [PAGES]   (default 16384); exit 2 where the kernel refuses userfaultfd. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define PG 4096UL

static int uffd;
static char *src;
static long missing, wp_faults, remaps;   /* the handler's; read by main after the faults it served */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* serves every fault as a pager would: a missing page filled from a "disk" copy, a write-protected one released */
static void *handler(void *arg)
{
    for (;;) {
        struct pollfd p = {uffd, POLLIN, 0};
        struct uffd_msg m;
        if (poll(&p, 1, -1) < 0 || read(uffd, &m, sizeof m) != (ssize_t)sizeof m)
            continue;
        if (m.event == UFFD_EVENT_REMAP) {
            __atomic_add_fetch(&remaps, 1, __ATOMIC_RELAXED);
            continue;
        }
        if (m.event != UFFD_EVENT_PAGEFAULT)
            continue;
        unsigned long a = m.arg.pagefault.address & ~(PG - 1);
        if (m.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) {
            struct uffdio_writeprotect w = {{a, PG}, 0};   /* clear the protection and wake the writer */
            if (ioctl(uffd, UFFDIO_WRITEPROTECT, &w))
                perror("uffd_pager_probe: UFFDIO_WRITEPROTECT");
            __atomic_add_fetch(&wp_faults, 1, __ATOMIC_RELAXED);
        } else {
            struct uffdio_copy c = {a, (unsigned long)src, PG, 0, 0};
            if (ioctl(uffd, UFFDIO_COPY, &c) && errno != EEXIST)
                perror("uffd_pager_probe: UFFDIO_COPY");
            __atomic_add_fetch(&missing, 1, __ATOMIC_RELAXED);
        }
    }
    return arg;
}

static char *registered(size_t n)
{
    char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct uffdio_register r = {{(unsigned long)m, n}, UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP, 0};
    if (m == MAP_FAILED || ioctl(uffd, UFFDIO_REGISTER, &r)) {
        perror("uffd_pager_probe: UFFDIO_REGISTER missing + wp");
        exit(2);
    }
    return m;
}

int main(int argc, char **argv)
{
    long pages = argc > 1 ? atol(argv[1]) : 16384;
    size_t n = (size_t)(pages > 0 ? pages : 16384) * PG;
    pages = (long)(n / PG);
    src = aligned_alloc(PG, PG);
    memset(src, 7, PG);
    uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
    struct uffdio_api api = {UFFD_API, UFFD_FEATURE_EVENT_REMAP | UFFD_FEATURE_PAGEFAULT_FLAG_WP, 0};
    if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) {
        fprintf(stderr, "uffd_pager_probe: userfaultfd refused here: %s\n", strerror(errno));
        return 2;
    }
    pthread_t th;
    pthread_create(&th, NULL, handler, NULL);

    /* a table's range (a shared mapping), and the registered anonymous mapping moved over it in one call */
    char *tmp = registered(n);
    char *dst = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mremap(tmp, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, dst) != dst) {
        perror("uffd_pager_probe: mremap");
        return 1;
    }
    double t0 = now();
    for (size_t i = 0; i < n; i += PG)
        dst[i] = 1;   /* each a missing fault, filled by UFFDIO_COPY */
    double t1 = now();
    int ok = 1;
    for (size_t i = 0; i < n; i += PG)
        ok &= dst[i] == 1 && dst[i + 1] == 7;
    struct uffdio_writeprotect w = {{(unsigned long)dst, n}, UFFDIO_WRITEPROTECT_MODE_WP};
    if (ioctl(uffd, UFFDIO_WRITEPROTECT, &w)) {
        perror("uffd_pager_probe: UFFDIO_WRITEPROTECT range");
        return 1;
    }
    double t2 = now();
    for (size_t i = 0; i < n; i += PG)
        dst[i] = 2;   /* each a synchronous write-protect fault: the writer waits for the handler */
    double t3 = now();

    /* rows never written: the zero page mapped over a registered range in one call, then first writes */
    char *z = registered(n);
    long before = __atomic_load_n(&missing, __ATOMIC_RELAXED);
    double t4 = now();
    struct uffdio_zeropage zp = {{(unsigned long)z, n}, 0, 0};
    if (ioctl(uffd, UFFDIO_ZEROPAGE, &zp))
        perror("uffd_pager_probe: UFFDIO_ZEROPAGE");
    double t5 = now();
    for (size_t i = 0; i < n; i += PG)
        z[i] = 1;
    double t6 = now();

    char *plain = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    double t7 = now();
    for (size_t i = 0; i < n; i += PG)
        plain[i] = 1;
    double t8 = now();

    printf("registration kept across mremap: %s (%ld remap event); data as filled: %s\n",
           __atomic_load_n(&missing, __ATOMIC_RELAXED) ? "yes" : "no", remaps, ok ? "yes" : "NO");
    printf("%ld pages: missing fault served by the handler %.2f us; sync write-protect fault %.2f us; zero page over "
           "all in one call %.2f ms, then a first write %.2f us (%ld trapped); plain anonymous first touch %.2f us\n",
           pages, (t1 - t0) / pages * 1e6, (t3 - t2) / pages * 1e6, (t5 - t4) * 1e3, (t6 - t5) / pages * 1e6,
           __atomic_load_n(&missing, __ATOMIC_RELAXED) - before, (t8 - t7) / pages * 1e6);
    return ok ? 0 : 1;
}
