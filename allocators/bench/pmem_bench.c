/* pmem_bench.c -- alloc+free throughput of rtkit's PMEM pool vs malloc, memkind PMEM kind, libpmemobj; recovery speed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <libpmemobj.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "rtkit/pmem.h"

/* Usage: pmem_bench [throughput|recovery|all] [--rounds N] [--secs S] [--dirs /dev/shm,/tmp] [--recovery-gb G]
 * Configurations are interleaved (A B C ... A B C ...) and each cell reports the median over rounds. */

enum { C_MALLOC, C_MEMKIND, C_PMEMOBJ, C_RTK_VOLATILE, C_RTK_DURABLE, C_RTK_DURABLE_MSYNC, NCONF };
static const char *conf_name[NCONF] = {"malloc", "memkind-pmem", "pmemobj", "rtkit-volatile", "rtkit-durable",
                                       "rtkit-durable-msync"};

/* memkind through dlopen (Debian ships libmemkind.so.0 without headers) */
typedef void *memkind_t;
static int (*mk_create_pmem)(const char *, size_t, memkind_t *);
static void *(*mk_malloc)(memkind_t, size_t);
static void (*mk_free)(memkind_t, void *);
static int (*mk_destroy)(memkind_t);

struct ctx {
    int conf;
    memkind_t mk;
    PMEMobjpool *pop;
    rtkit_pmem_pool *rp;
};

#define RING 256
struct targ {
    struct ctx *c;
    size_t size;
    double secs;
    uint64_t ops;
    pthread_barrier_t *bar;
    int failed;
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* one "op" = one allocation plus one free, steady state over a ring of RING live objects */
static void *bench_thread(void *arg) {
    struct targ *t = arg;
    struct ctx *c = t->c;
    void *ring[RING] = {0};
    PMEMoid oids[RING];
    uint64_t handles[RING] = {0};
    memset(oids, 0, sizeof oids);
    pthread_barrier_wait(t->bar);
    double end = now() + t->secs;
    uint64_t ops = 0;
    while (1) {
        for (int i = 0; i < RING; i++) {
            switch (c->conf) {
            case C_MALLOC:
                free(ring[i]);
                ring[i] = malloc(t->size);
                *(volatile char *)ring[i] = 1;
                break;
            case C_MEMKIND:
                if (ring[i]) mk_free(c->mk, ring[i]);
                ring[i] = mk_malloc(c->mk, t->size);
                if (!ring[i]) { t->failed = 1; goto out; }
                *(volatile char *)ring[i] = 1;
                break;
            case C_PMEMOBJ:
                if (!OID_IS_NULL(oids[i])) pmemobj_free(&oids[i]);
                if (pmemobj_alloc(c->pop, &oids[i], t->size, 1, NULL, NULL)) { t->failed = 1; goto out; }
                *(volatile char *)pmemobj_direct(oids[i]) = 1;
                break;
            default:
                if (handles[i]) rtkit_pmem_free(c->rp, handles[i]);
                if (rtkit_pmem_alloc(c->rp, t->size, &handles[i])) { t->failed = 1; goto out; }
                *(volatile char *)rtkit_pmem_ptr(c->rp, handles[i]) = 1;
                break;
            }
        }
        ops += RING;
        if (now() >= end) break;
    }
out:
    for (int i = 0; i < RING; i++) {
        switch (c->conf) {
        case C_MALLOC: free(ring[i]); break;
        case C_MEMKIND: if (ring[i]) mk_free(c->mk, ring[i]); break;
        case C_PMEMOBJ: if (!OID_IS_NULL(oids[i])) pmemobj_free(&oids[i]); break;
        default: if (handles[i]) rtkit_pmem_free(c->rp, handles[i]); break;
        }
    }
    t->ops = ops;
    return NULL;
}

static int ctx_open(struct ctx *c, int conf, const char *dir, uint64_t pool_size) {
    memset(c, 0, sizeof *c);
    c->conf = conf;
    char path[512];
    snprintf(path, sizeof path, "%s/rtkit-bench-%d-%d.pool", dir, getpid(), conf);
    unlink(path);
    if (conf == C_MEMKIND) {
        if (!mk_create_pmem) return -1;
        return mk_create_pmem(dir, 0, &c->mk) ? -1 : 0;
    }
    if (conf == C_PMEMOBJ) {
        c->pop = pmemobj_create(path, "bench", pool_size, 0644);
        return c->pop ? 0 : -1;
    }
    if (conf >= C_RTK_VOLATILE) {
        rtkit_pmem_options o;
        rtkit_pmem_options_init(&o);
        o.durable = conf != C_RTK_VOLATILE;
        o.force_msync = conf == C_RTK_DURABLE_MSYNC;
        return rtkit_pmem_create(path, pool_size, &o, &c->rp) ? -1 : 0;
    }
    return 0;
}

static void ctx_close(struct ctx *c, const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/rtkit-bench-%d-%d.pool", dir, getpid(), c->conf);
    if (c->mk) mk_destroy(c->mk);
    if (c->pop) pmemobj_close(c->pop);
    if (c->rp) rtkit_pmem_close(c->rp);
    if (c->conf == C_PMEMOBJ || c->conf >= C_RTK_VOLATILE) unlink(path);
}

static double run_cell(struct ctx *c, size_t size, int threads, double secs) {
    pthread_t tid[8];
    struct targ ta[8];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, threads);
    for (int i = 0; i < threads; i++) {
        ta[i] = (struct targ){c, size, secs, 0, &bar, 0};
        pthread_create(&tid[i], NULL, bench_thread, &ta[i]);
    }
    uint64_t ops = 0;
    int failed = 0;
    double t0 = now();
    for (int i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
        ops += ta[i].ops;
        failed |= ta[i].failed;
    }
    double el = now() - t0;
    pthread_barrier_destroy(&bar);
    return failed ? -1 : ops / el;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void throughput(const char *dirs, int rounds, double secs) {
    static const size_t sizes[] = {64, 256, 1024, 4096};
    char buf[512];
    snprintf(buf, sizeof buf, "%s", dirs);
    printf("# alloc+free pairs per second (median of %d interleaved rounds of %.2fs; ring of %d live objects per thread)\n",
           rounds, secs, RING);
    printf("%-10s %-7s %-3s", "fs", "size", "thr");
    for (int c = 0; c < NCONF; c++) printf(" %14s", conf_name[c]);
    printf(" %10s %10s\n", "vol/memkind", "dur/pmemobj");
    for (char *dir = strtok(buf, ","); dir; dir = strtok(NULL, ",")) {
        struct ctx ctx[NCONF];
        int ok[NCONF];
        for (int c = 0; c < NCONF; c++) ok[c] = ctx_open(&ctx[c], c, dir, 512ull << 20) == 0;
        for (int threads = 1; threads <= 2; threads++)
            for (unsigned s = 0; s < sizeof sizes / sizeof *sizes; s++) {
                double v[NCONF][32];
                for (int r = 0; r < rounds; r++)
                    for (int c = 0; c < NCONF; c++)
                        v[c][r] = ok[c] ? run_cell(&ctx[c], sizes[s], threads, secs) : -1;
                double med[NCONF];
                printf("%-10s %-7zu %-3d", dir, sizes[s], threads);
                for (int c = 0; c < NCONF; c++) {
                    med[c] = median(v[c], rounds);
                    if (med[c] < 0) printf(" %14s", "n/a");
                    else if (med[c] >= 1e6) printf(" %13.2fM", med[c] / 1e6);
                    else printf(" %13.1fK", med[c] / 1e3);
                }
                printf(" %10.2fx %10.2fx\n", med[C_MEMKIND] > 0 ? med[C_RTK_VOLATILE] / med[C_MEMKIND] : 0,
                       med[C_PMEMOBJ] > 0 ? med[C_RTK_DURABLE] / med[C_PMEMOBJ] : 0);
                fflush(stdout);
            }
        for (int c = 0; c < NCONF; c++) if (ok[c]) ctx_close(&ctx[c], dir);
    }
}

static void recovery(const char *dir, double gb, int rounds) {
    static const uint64_t rec_sizes[] = {48, 200, 1000};
    printf("# recovery: open() of a %.1f GiB pool ~90%% full of records, on %s (median of %d)\n", gb, dir, rounds);
    printf("%-8s %12s %10s %12s %12s %10s\n", "record", "records", "scan ms", "scan GB/s", "open ms", "open GB/s");
    for (unsigned k = 0; k < sizeof rec_sizes / sizeof *rec_sizes; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/rtkit-bench-recovery-%d.pool", dir, getpid());
        unlink(path);
        uint64_t size = (uint64_t)(gb * (1 << 30));
        rtkit_pmem_options o;
        rtkit_pmem_options_init(&o);
        o.durable = 0;
        o.rebalance_ms = -1;
        rtkit_pmem_pool *p;
        if (rtkit_pmem_create(path, size, &o, &p)) {
            printf("create failed: %s\n", rtkit_pmem_last_error());
            return;
        }
        uint64_t h, n = 0, target = size / (rec_sizes[k] + 16) * 9 / 10;
        while (n < target && rtkit_pmem_alloc(p, rec_sizes[k], &h) == 0) {
            n++;
            if (n % 5 == 0) rtkit_pmem_free(p, h); /* holes for the free lists */
        }
        rtkit_pmem_close(p);
        double scan[16], open_t[16];
        uint64_t live = 0;
        for (int r = 0; r < rounds && r < 16; r++) {
            double t0 = now();
            if (rtkit_pmem_open(path, &o, &p)) {
                printf("open failed: %s\n", rtkit_pmem_last_error());
                return;
            }
            open_t[r] = now() - t0;
            rtkit_pmem_stats st;
            rtkit_pmem_stats_get(p, &st);
            scan[r] = st.recovery_ns * 1e-9;
            live = st.recovered_records;
            rtkit_pmem_close(p);
        }
        double ms = median(scan, rounds), mo = median(open_t, rounds);
        printf("%-8llu %12llu %10.1f %12.2f %12.1f %10.2f\n", (unsigned long long)rec_sizes[k], (unsigned long long)live,
               ms * 1e3, size / ms / 1e9, mo * 1e3, size / mo / 1e9);
        fflush(stdout);
        unlink(path);
    }
}

int main(int argc, char **argv) {
    const char *what = argc > 1 && argv[1][0] != '-' ? argv[1] : "all";
    int rounds = 5;
    double secs = 0.2, gb = 1.0;
    const char *dirs = "/dev/shm,/tmp";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--secs") && i + 1 < argc) secs = atof(argv[++i]);
        else if (!strcmp(argv[i], "--dirs") && i + 1 < argc) dirs = argv[++i];
        else if (!strcmp(argv[i], "--recovery-gb") && i + 1 < argc) gb = atof(argv[++i]);
    }
    if (rounds < 1) rounds = 1;
    if (rounds > 31) rounds = 31;
    void *mk = dlopen("libmemkind.so.0", RTLD_NOW);
    if (mk) {
        mk_create_pmem = (int (*)(const char *, size_t, memkind_t *))dlsym(mk, "memkind_create_pmem");
        mk_malloc = (void *(*)(memkind_t, size_t))dlsym(mk, "memkind_malloc");
        mk_free = (void (*)(memkind_t, void *))dlsym(mk, "memkind_free");
        mk_destroy = (int (*)(memkind_t))dlsym(mk, "memkind_destroy_kind");
    } else {
        fprintf(stderr, "pmem_bench: libmemkind.so.0 not found (%s); memkind column is n/a\n", dlerror());
    }
    if (!strcmp(what, "throughput") || !strcmp(what, "all")) throughput(dirs, rounds, secs);
    if (!strcmp(what, "recovery") || !strcmp(what, "all")) recovery("/dev/shm", gb, rounds);
    return 0;
}
