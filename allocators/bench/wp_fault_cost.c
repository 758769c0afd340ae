/* wp_fault_cost.c -- what the tier pager's heat costs the steps: the first write to a page after a PAGEMAP_SCAN
 * re-armed its asynchronous write-protection (one fault the kernel resolves itself), against a write to a page
 * already writable. Not a test, not run by the suite (docs/results.md, "The same work in DRAM").
 * Usage: wp_fault_cost [PAGES]   (default 65536); exit 2 where the kernel refuses. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/uffd_abi.h"

#define PG 4096UL
#define ROUNDS 5

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static long minor_faults(void)
{
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_minflt;
}

/* one write to every page; its cost per page in microseconds */
static double write_all(volatile char *m, unsigned long n)
{
    double t0 = now_s();
    for (unsigned long i = 0; i < n; i++)
        m[i * PG]++;
    return (now_s() - t0) * 1e6 / (double)n;
}

int main(int argc, char **argv)
{
    unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 10) : 65536;
    int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY_);
    struct uffdio_api_ api = {UFFD_API_, UFFD_FEATURE_WP_ASYNC_, 0};
    if (uffd < 0 || ioctl(uffd, UFFDIO_API_, &api) != 0) {
        perror("wp_fault_cost: userfaultfd with asynchronous write-protect");
        return 2;
    }
    char *m = mmap(NULL, n * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return 1;
    madvise(m, n * PG, MADV_NOHUGEPAGE);  /* the pager's mappings take no huge page either */
    for (unsigned long i = 0; i < n; i++)
        m[i * PG] = 1;
    struct uffdio_register_ reg = {(uint64_t)(uintptr_t)m, n * PG, UFFDIO_REGISTER_MODE_WP_, 0};
    int pagemap = open("/proc/self/pagemap", O_RDONLY);
    if (ioctl(uffd, UFFDIO_REGISTER_, &reg) != 0 || pagemap < 0) {
        perror("wp_fault_cost: write-protect registration or /proc/self/pagemap");
        return 2;
    }
    static struct { uint64_t start, end, flags; } vec[1];  /* PAGEMAP_SCAN's page_region */
    printf("%lu pages; per page: the scan that re-arms them, the first write after it, a second write\n", n);
    for (int r = 0; r < ROUNDS; r++) {
        struct pm_scan_arg_ a = {sizeof a, PM_SCAN_WP_MATCHING_ | PM_SCAN_CHECK_WPASYNC_, (uint64_t)(uintptr_t)m,
                                 (uint64_t)(uintptr_t)(m + n * PG), 0, (uint64_t)(uintptr_t)vec, 1, 0,
                                 PAGE_IS_PRESENT_, 0, PAGE_IS_WRITTEN_, PAGE_IS_WRITTEN_};
        double t0 = now_s();
        if (ioctl(pagemap, PAGEMAP_SCAN_, &a) < 0) {
            perror("wp_fault_cost: PAGEMAP_SCAN");
            return 2;
        }
        double scan_us = (now_s() - t0) * 1e6 / (double)n;
        long f0 = minor_faults();
        double first = write_all(m, n);
        long faults = minor_faults() - f0;
        double second = write_all(m, n);
        printf("round %d: scan %.3f us, first write %.3f us (%ld faults), second write %.3f us\n", r, scan_us, first,
               faults, second);
    }
    return 0;
}
