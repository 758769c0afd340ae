/* pmem_crash.c -- kill -9 trials: a child allocates, writes and acknowledges records; the parent reopens and verifies. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "rtkit/pmem.h"

#define POOL_SIZE (8u << 20)
struct ack { uint64_t type, handle, nbytes, seed; }; /* type 'A' alloc returned, 'F' about to free */
struct live { uint64_t nbytes, seed; };

static char pool_path[256], ack_path[256];
static int ack_fd, durable_mode;
static rtkit_pmem_pool *pool;

static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
static inline uint64_t pattern(uint64_t h, uint64_t seed, uint64_t i) { return (h * 0x9e3779b97f4a7c15ull) ^ seed ^ (i << 3); }

static void *child_thread(void *arg) {
    uint64_t seed = (uint64_t)(uintptr_t)arg * 0x2545F4914F6CDD1Dull + (uint64_t)getpid();
    uint64_t own[512];
    int n = 0;
    for (;;) {
        uint64_t r = rnd(&seed);
        if (n > 0 && (r % 10 < 3 || n == 512)) {
            int k = (int)((r >> 8) % n);
            struct ack a = {'F', own[k], 0, 0};
            if (write(ack_fd, &a, sizeof a) != sizeof a) _exit(4);
            if (rtkit_pmem_free(pool, own[k])) _exit(3);
            own[k] = own[--n];
            continue;
        }
        uint64_t nbytes = (r % 64 == 0) ? 70000 + (r >> 16) % 60000 : 8 + (r >> 16) % 4089;
        nbytes &= ~7ull;
        uint64_t h;
        int rc = rtkit_pmem_alloc(pool, nbytes, &h);
        if (rc == RTKIT_PMEM_ENOSPC) {
            while (n > 0) {
                struct ack a = {'F', own[--n], 0, 0};
                if (write(ack_fd, &a, sizeof a) != sizeof a) _exit(4);
                if (rtkit_pmem_free(pool, a.handle)) _exit(3);
            }
            continue;
        }
        if (rc) _exit(5);
        uint64_t s2 = rnd(&seed);
        uint64_t *w = rtkit_pmem_ptr(pool, h);
        for (uint64_t i = 0; i < nbytes / 8; i++) w[i] = pattern(h, s2, i);
        rtkit_pmem_persist(pool, h, 0, nbytes);
        struct ack a = {'A', h, nbytes, s2};
        if (write(ack_fd, &a, sizeof a) != sizeof a) _exit(4);
        own[n++] = h;
    }
    return NULL;
}

static void child(void) {
    rtkit_pmem_options o;
    rtkit_pmem_options_init(&o);
    o.durable = durable_mode;
    o.rebalance_ms = 1;
    o.rebalance_min = 4;
    if (rtkit_pmem_open(pool_path, &o, &pool)) {
        fprintf(stderr, "child open: %s\n", rtkit_pmem_last_error());
        _exit(6);
    }
    pthread_t t;
    pthread_create(&t, NULL, child_thread, (void *)1);
    child_thread((void *)2);
}

int main(int argc, char **argv) {
    int trials = argc > 1 ? atoi(argv[1]) : 120;
    const char *dir = argc > 2 ? argv[2] : "/dev/shm";
    long max_delay_us = (argc > 3 ? atol(argv[3]) : 25) * 1000L; /* kill after 0..max ms */
    snprintf(pool_path, sizeof pool_path, "%s/rtkit-pmem-crash-%d.pool", dir, getpid());
    snprintf(ack_path, sizeof ack_path, "%s/rtkit-pmem-crash-%d.ack", dir, getpid());
    rtkit_pmem_options o;
    rtkit_pmem_options_init(&o);
    o.segment_size = 64 * 1024;
    o.rebalance_ms = -1;
    if (rtkit_pmem_create(pool_path, POOL_SIZE, &o, &pool)) return fprintf(stderr, "create: %s\n", rtkit_pmem_last_error()), 2;
    rtkit_pmem_close(pool);
    size_t map_len = (POOL_SIZE / 16) * sizeof(struct live);
    struct live *live = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint64_t seed = (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
    int failures = 0;
    uint64_t total_acks = 0, total_checked = 0, worked = 0;
    for (int t = 0; t < trials && failures == 0; t++) {
        durable_mode = t % 2;
        ack_fd = open(ack_path, O_CREAT | O_TRUNC | O_WRONLY | O_APPEND, 0644);
        pid_t pid = fork();
        if (pid == 0) child();
        close(ack_fd);
        struct timespec d = {0, (long)(rnd(&seed) % (uint64_t)max_delay_us) * 1000L};
        nanosleep(&d, NULL);
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        if (!WIFSIGNALED(st)) {
            fprintf(stderr, "trial %d: child exited by itself with status %d\n", t, WEXITSTATUS(st));
            failures++;
            break;
        }
        /* replay the acknowledgements */
        int fd = open(ack_path, O_RDONLY);
        struct ack a;
        uint64_t acks = 0;
        while (read(fd, &a, sizeof a) == sizeof a) {
            acks++;
            if (a.type == 'A') live[a.handle / 16] = (struct live){a.nbytes, a.seed};
            else live[a.handle / 16].nbytes = 0;
        }
        close(fd);
        total_acks += acks;
        worked += acks > 0;
        rtkit_pmem_options_init(&o);
        o.rebalance_ms = -1;
        o.durable = 0; /* the parent verifies; its own fill needs no flushes */
        int rc = rtkit_pmem_open(pool_path, &o, &pool);
        if (rc) {
            fprintf(stderr, "trial %d: reopen failed: %s\n", t, rtkit_pmem_last_error());
            failures++;
            break;
        }
        /* every acknowledged record: allocated, same size, same contents */
        for (uint64_t i = 0; i < POOL_SIZE / 16; i++) {
            if (!live[i].nbytes) continue;
            uint64_t h = i * 16, req;
            total_checked++;
            if (rtkit_pmem_record_size(pool, h, &req, NULL) || req != live[i].nbytes) {
                fprintf(stderr, "trial %d: acknowledged record %llu (%llu bytes) lost: %s\n", t, (unsigned long long)h,
                        (unsigned long long)live[i].nbytes, rtkit_pmem_last_error());
                failures++;
                continue;
            }
            uint64_t *w = rtkit_pmem_ptr(pool, h);
            for (uint64_t k = 0; k < req / 8; k++)
                if (w[k] != pattern(h, live[i].seed, k)) {
                    fprintf(stderr, "trial %d: record %llu word %llu differs\n", t, (unsigned long long)h,
                            (unsigned long long)k);
                    failures++;
                    break;
                }
        }
        /* live records the parent does not know (alloc returned without ack, free intent) are freed;
         * half of the known ones too, so the pool keeps turning over */
        uint64_t h = 0, next;
        rtkit_pmem_next(pool, 0, &h, NULL);
        while (h) {
            rtkit_pmem_next(pool, h, &next, NULL);
            if (!live[h / 16].nbytes || (rnd(&seed) & 1)) {
                live[h / 16].nbytes = 0;
                if (rtkit_pmem_free(pool, h)) {
                    fprintf(stderr, "trial %d: free %llu: %s\n", t, (unsigned long long)h, rtkit_pmem_last_error());
                    failures++;
                }
            }
            h = next;
        }
        /* nothing handed out twice: fill the pool, no new record may be a known live one */
        static uint64_t fillh[POOL_SIZE / 64];
        int nf = 0;
        while (nf < (int)(POOL_SIZE / 64) && rtkit_pmem_alloc(pool, (rnd(&seed) % 2) ? 48 : 1000, &fillh[nf]) == 0) {
            if (live[fillh[nf] / 16].nbytes) {
                fprintf(stderr, "trial %d: handle %llu handed out while live\n", t, (unsigned long long)fillh[nf]);
                failures++;
            }
            nf++;
        }
        for (int i = 0; i < nf; i++) rtkit_pmem_free(pool, fillh[i]);
        rtkit_pmem_close(pool);
        rtkit_pmem_check_report rep;
        if (rtkit_pmem_check(pool_path, &rep)) {
            fprintf(stderr, "trial %d: check: %s\n", t, rep.first_error);
            failures++;
        }
    }
    unlink(pool_path);
    unlink(ack_path);
    fprintf(stderr, "pmem_crash: %d trials, %llu acks, %llu acknowledged records verified, %llu trials with work: %s\n",
            trials, (unsigned long long)total_acks, (unsigned long long)total_checked, (unsigned long long)worked,
            failures ? "FAILED" : "ok");
    return failures || worked < (uint64_t)trials / 3 ? 1 : 0;
}
