/* pmem_stress.c -- PMEM pool under many threads: cross-thread frees, background moves, no record handed out twice. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "rtkit/pmem.h"

#define THREADS 6
#define ITERS 60000
#define SLOTS 4096

static rtkit_pmem_pool *pool;
static _Atomic uint64_t exchange[SLOTS]; /* handles parked for another thread to free */
static atomic_int errors;
static atomic_long double_free_seen;

static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* every live record holds its own handle in each 8-byte word: an overlap would be seen at free */
static void fill(uint64_t h, uint64_t n) {
    uint64_t *w = rtkit_pmem_ptr(pool, h);
    for (uint64_t i = 0; i < n / 8; i++) w[i] = h ^ (i * 0x9e37);
}

static int verify_and_free(uint64_t h) {
    uint64_t req;
    if (rtkit_pmem_record_size(pool, h, &req, NULL)) {
        fprintf(stderr, "handle %llu not live: %s\n", (unsigned long long)h, rtkit_pmem_last_error());
        return 1;
    }
    uint64_t *w = rtkit_pmem_ptr(pool, h);
    for (uint64_t i = 0; i < req / 8; i++)
        if (w[i] != (h ^ (i * 0x9e37))) {
            fprintf(stderr, "record %llu overwritten at word %llu\n", (unsigned long long)h, (unsigned long long)i);
            return 1;
        }
    int rc = rtkit_pmem_free(pool, h);
    if (rc) fprintf(stderr, "free %llu: %s\n", (unsigned long long)h, rtkit_pmem_last_error());
    return rc != 0;
}

static void *worker(void *arg) {
    uint64_t seed = 0x1234567 + (uintptr_t)arg * 7919;
    uint64_t mine[64];
    int nmine = 0;
    for (int it = 0; it < ITERS; it++) {
        uint64_t r = rnd(&seed);
        uint64_t n = (r % 100 == 0) ? 70000 + r % 50000 : 8 + (r >> 8) % 4089;
        n &= ~7ull;
        if (!n) n = 8;
        uint64_t h;
        int rc = rtkit_pmem_alloc(pool, n, &h);
        if (rc == RTKIT_PMEM_ENOSPC) {
            while (nmine) errors += verify_and_free(mine[--nmine]);
            continue;
        }
        if (rc) {
            fprintf(stderr, "alloc: %s\n", rtkit_pmem_last_error());
            errors++;
            break;
        }
        fill(h, n);
        if (r & 0x10000) { /* park it for someone else; free whatever was parked there */
            uint64_t old = atomic_exchange(&exchange[(r >> 20) % SLOTS], h);
            if (old) errors += verify_and_free(old);
        } else {
            if (nmine == 64) {
                int k = (int)((r >> 24) % 64);
                errors += verify_and_free(mine[k]);
                mine[k] = mine[--nmine];
            }
            mine[nmine++] = h;
        }
    }
    while (nmine) errors += verify_and_free(mine[--nmine]);
    return NULL;
}

static void *racer(void *arg) {
    uint64_t h = *(uint64_t *)arg;
    int rc = rtkit_pmem_free(pool, h);
    if (rc == RTKIT_PMEM_EDOUBLEFREE) double_free_seen++;
    else if (rc) errors++;
    return NULL;
}

int main(int argc, char **argv) {
    char path[256];
    snprintf(path, sizeof path, "%s/rtkit-pmem-stress-%d.pool", argc > 1 ? argv[1] : "/dev/shm", getpid());
    rtkit_pmem_options o;
    rtkit_pmem_options_init(&o);
    o.segment_size = 256 * 1024;
    o.rebalance_ms = 2;
    o.rebalance_min = 8;
    o.durable = 0;
    int rc = rtkit_pmem_create(path, 96 << 20, &o, &pool);
    if (rc) return fprintf(stderr, "create: %s\n", rtkit_pmem_last_error()), 2;
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < SLOTS; i++) {
        uint64_t h = atomic_exchange(&exchange[i], 0);
        if (h) errors += verify_and_free(h);
    }
    /* concurrent double free (durable mode): exactly one of two frees wins */
    rtkit_pmem_pool *main_pool = pool;
    rtkit_pmem_options od;
    rtkit_pmem_options_init(&od);
    od.durable = 1;
    od.segment_size = 64 * 1024;
    if (rtkit_pmem_anonymous(4 << 20, &od, &pool)) return fprintf(stderr, "anonymous: %s\n", rtkit_pmem_last_error()), 2;
    for (int i = 0; i < 200; i++) {
        uint64_t h;
        rtkit_pmem_alloc(pool, 64, &h);
        pthread_t a, b;
        pthread_create(&a, NULL, racer, &h);
        pthread_create(&b, NULL, racer, &h);
        pthread_join(a, NULL);
        pthread_join(b, NULL);
    }
    rtkit_pmem_close(pool);
    pool = main_pool;
    rtkit_pmem_stats st;
    rtkit_pmem_stats_get(pool, &st);
    if (st.allocated_records != 0) {
        fprintf(stderr, "stats say %llu records live after freeing all\n", (unsigned long long)st.allocated_records);
        errors++;
    }
    if (st.background_runs == 0) {
        fprintf(stderr, "background thread never ran\n");
        errors++;
    }
    fprintf(stderr, "pmem_stress: moves=%llu moved=%llu segments class=%llu free=%llu double-frees caught=%ld\n",
            (unsigned long long)st.background_moves, (unsigned long long)st.moved_records,
            (unsigned long long)st.segments_class, (unsigned long long)st.segments_free, (long)double_free_seen);
    if (double_free_seen != 200) errors++;
    rtkit_pmem_close(pool);
    rc = rtkit_pmem_open(path, &o, &pool);
    if (rc) return fprintf(stderr, "reopen: %s\n", rtkit_pmem_last_error()), 1;
    uint64_t h;
    rtkit_pmem_next(pool, 0, &h, NULL);
    if (h) fprintf(stderr, "a record is live after reopen\n"), errors++;
    rtkit_pmem_close(pool);
    unlink(path);
    fprintf(stderr, "pmem_stress: %s\n", errors ? "FAILED" : "ok");
    return errors ? 1 : 0;
}
