/* uffd_move_cost.c -- what one page of the tier pager's eviction costs on this kernel, by the length of the run one
 * UFFDIO_MOVE takes and by how often the stage it moves into is freed, with and without a second thread of the job
 * running on another core (every TLB shoot-down then interrupts it). Not a test, not run by the suite.
 * Usage: uffd_move_cost [PAGES]   (default 65536, a file of that size in $TMPDIR); exit 2 where the kernel refuses. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/uffd_abi.h"

#define PG 4096UL
#define STAGE 1024UL

static volatile int stop;
static char sibling_mem[4096];

static double clock_s(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* the job's other thread: keeps the process's memory map live on another core */
static void *sibling(void *arg)
{
    (void)arg;
    unsigned long sum = 0;
    while (!stop)
        for (int i = 0; i < 4096; i += 64)
            sum += ((volatile char *)sibling_mem)[i];
    return (void *)sum;
}

static int uffd;
static struct uffdio_register_ reg_mem, reg_stage;

/* every page of mem present again (unregistered meanwhile: a missing page would wait for a handler) */
static void fill(char *mem, size_t n)
{
    ioctl(uffd, UFFDIO_UNREGISTER_, &reg_mem.start);
    for (size_t i = 0; i < n; i++)
        mem[i * PG] = (char)i;
    ioctl(uffd, UFFDIO_REGISTER_, &reg_mem);
}

/* evict all n pages as the pager does: move `run` pages at a time, write them, free the stage every `free_every` */
static int evict_all(char *mem, char *stage, size_t n, size_t run, size_t free_every, int fd, const char *label)
{
    fill(mem, n);
    double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID), t_move = 0, t_free = 0;
    size_t used = 0;
    for (size_t i = 0; i < n; i += run) {
        double a = clock_s(CLOCK_MONOTONIC);
        struct uffdio_move_ mv = {(uint64_t)(uintptr_t)(stage + used * PG), (uint64_t)(uintptr_t)(mem + i * PG),
                                  run * PG, 0, 0};
        if (ioctl(uffd, UFFDIO_MOVE_, &mv) != 0) {
            perror("UFFDIO_MOVE");
            return 1;
        }
        double b = clock_s(CLOCK_MONOTONIC);
        if (pwrite(fd, stage + used * PG, run * PG, (off_t)(i * PG)) != (ssize_t)(run * PG)) {
            perror("pwrite");
            return 1;
        }
        used += run;
        double c = clock_s(CLOCK_MONOTONIC);
        if (used + run > free_every) {
            madvise(stage, used * PG, MADV_DONTNEED);
            used = 0;
        }
        t_move += b - a;
        t_free += clock_s(CLOCK_MONOTONIC) - c;
    }
    madvise(stage, used * PG, MADV_DONTNEED);
    double wall = clock_s(CLOCK_MONOTONIC) - w0, cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
    printf("%-9s run %3zu, stage freed every %4zu pages: %5.2f us a page (move %.2f, free %.2f), CPU %5.2f us\n", label,
           run, free_every, wall / (double)n * 1e6, t_move / (double)n * 1e6, t_free / (double)n * 1e6,
           cpu / (double)n * 1e6);
    return 0;
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 65536;
    uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    struct uffdio_api_ api = {UFFD_API_, UFFD_FEATURE_MOVE_, 0};
    if (uffd < 0 || ioctl(uffd, UFFDIO_API_, &api) != 0) {
        fprintf(stderr, "userfaultfd with UFFDIO_MOVE refused here\n");
        return 2;
    }
    char *mem = mmap(NULL, n * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *stage = mmap(NULL, STAGE * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(mem, n * PG, MADV_NOHUGEPAGE);
    madvise(stage, STAGE * PG, MADV_NOHUGEPAGE);
    reg_mem = (struct uffdio_register_){(uint64_t)(uintptr_t)mem, n * PG, UFFDIO_REGISTER_MODE_MISSING_, 0};
    reg_stage = (struct uffdio_register_){(uint64_t)(uintptr_t)stage, STAGE * PG, UFFDIO_REGISTER_MODE_MISSING_, 0};
    if (ioctl(uffd, UFFDIO_REGISTER_, &reg_mem) != 0 || ioctl(uffd, UFFDIO_REGISTER_, &reg_stage) != 0) {
        perror("UFFDIO_REGISTER");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/uffd_move_cost.%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)(n * PG)) != 0) {
        perror(path);
        return 1;
    }
    unlink(path);
    int rc = 0;
    for (int busy = 1; busy >= 0 && !rc; busy--) {
        pthread_t t;
        stop = 0;
        if (busy)
            pthread_create(&t, NULL, sibling, NULL);
        const char *label = busy ? "sibling" : "alone";
        static const size_t runs[] = {1, 2, 4, 16, 64};
        for (size_t r = 0; r < sizeof runs / sizeof runs[0] && !rc; r++)
            rc = evict_all(mem, stage, n, runs[r], runs[r], fd, label) ||
                 evict_all(mem, stage, n, runs[r], STAGE, fd, label);
        stop = 1;
        if (busy)
            pthread_join(t, NULL);
    }
    return rc;
}
