/* scaling_replay.c -- N threads replay a training step's allocations (sizes and lifetimes from a census) step after
 * step; prints per-step time, minor faults and voluntary context switches inside the allocation phases as JSON.
 * Usage: scaling_replay PATTERN THREADS STEPS [HOLD_STEPS] [CROSS_PERCENT]
 *   PATTERN        text file, one row a line: "SIZE COUNT KIND" (bytes, blocks per thread per step, KIND 0: freed at
 *                  the end of its step, 1: long-lived, freed HOLD_STEPS steps later); '#' lines are comments
 *   HOLD_STEPS     steps a long-lived block stays live (default 8)
 *   CROSS_PERCENT  share of the step-lived blocks that the next thread frees in the next step (default 25), as a
 *                  tensor made by one op is freed by the thread that runs its last consumer
 * Every block's pages are written once (the first byte of each page, as TensorFlow writes a tensor). Thread 0 calls
 * rtkit_step_mark() (found with dlsym(RTLD_DEFAULT), so only when librtkit_malloc.so is preloaded) at the end of
 * every step, inside the step's timed window. Voluntary context switches are counted per thread with
 * getrusage(RUSAGE_THREAD) around the allocation phase only (the barriers between steps are outside it), so they
 * count the times a thread blocked in the kernel while allocating or freeing: futex waits on allocator locks and
 * waits on the address-space lock in mmap/munmap/page faults. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench_clock.h"
#include <unistd.h>

#define MAX_ROWS 256
#define MAX_THREADS 1024
#define MAX_HOLD 64

typedef struct {
    size_t size;
    long count;
    int kind;
} row_t;

typedef struct {
    void **p;
    long n;
} list_t;

typedef struct {
    int id;
    size_t *seq;          /* the step's allocation sizes in this thread's fixed order */
    unsigned char *kind;  /* per entry: 0 step-lived, 1 long-lived, 2 step-lived freed by the next thread */
    long nseq;
    list_t step_live;     /* this step's blocks freed by this thread at the step's end */
    list_t ring[MAX_HOLD];/* long-lived blocks by the step they were made in */
    list_t outbox[2];     /* blocks the next thread frees in the next step (double-buffered by step parity) */
} thread_t;

static row_t g_rows[MAX_ROWS];
static int g_nrows;
static int g_threads, g_steps, g_hold = 8, g_cross = 25;
static thread_t *g_t;
static pthread_barrier_t g_start, g_end;
static long g_page;
static long *g_vcs;   /* per step: voluntary switches in the allocation phases, summed over threads */
static long *g_ivcs;  /* per step: involuntary switches there (preemption: the machine's load, not the allocator) */

static uint64_t rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void die(const char *what)
{
    fprintf(stderr, "scaling_replay: %s\n", what);
    exit(2);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p)
        die("out of memory");
    return p;
}

static void read_pattern(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        die("cannot open the pattern file");
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        unsigned long long size;
        long count;
        int kind;
        if (sscanf(line, "%llu %ld %d", &size, &count, &kind) != 3 || size == 0 || count < 0 || kind < 0 || kind > 1)
            die("bad pattern line (expected: SIZE COUNT KIND)");
        if (g_nrows == MAX_ROWS)
            die("too many pattern rows");
        g_rows[g_nrows++] = (row_t){(size_t)size, count, kind};
    }
    fclose(f);
}

static void touch(char *p, size_t size)
{
    for (size_t off = 0; off < size; off += (size_t)g_page)
        p[off] = 1;
}

static void list_init(list_t *l, long cap)
{
    l->p = xmalloc(sizeof(void *) * (size_t)(cap ? cap : 1));
    l->n = 0;
}

static void list_free_all(list_t *l)
{
    for (long i = 0; i < l->n; i++)
        free(l->p[i]);
    l->n = 0;
}

static void thread_setup(thread_t *t)
{
    long n = 0, nlong = 0;
    for (int r = 0; r < g_nrows; r++) {
        n += g_rows[r].count;
        if (g_rows[r].kind)
            nlong += g_rows[r].count;
    }
    t->seq = xmalloc(sizeof(size_t) * (size_t)(n ? n : 1));
    t->kind = xmalloc((size_t)(n ? n : 1));
    t->nseq = 0;
    uint64_t s = 1000003u * (uint64_t)(t->id + 1);
    for (int r = 0; r < g_nrows; r++)
        for (long i = 0; i < g_rows[r].count; i++) {
            t->seq[t->nseq] = g_rows[r].size;
            t->kind[t->nseq] = g_rows[r].kind ? 1 : (rnd(&s) % 100 < (uint64_t)g_cross ? 2 : 0);
            t->nseq++;
        }
    /* one fixed interleaving of sizes, the same every step: the step pattern recurs */
    for (long i = t->nseq - 1; i > 0; i--) {
        long j = (long)(rnd(&s) % (uint64_t)(i + 1));
        size_t sz = t->seq[i];
        unsigned char k = t->kind[i];
        t->seq[i] = t->seq[j], t->kind[i] = t->kind[j];
        t->seq[j] = sz, t->kind[j] = k;
    }
    list_init(&t->step_live, n);
    for (int h = 0; h < g_hold; h++)
        list_init(&t->ring[h], nlong);
    list_init(&t->outbox[0], n);
    list_init(&t->outbox[1], n);
}

static long thread_switches(long *involuntary)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    *involuntary = ru.ru_nivcsw;
    return ru.ru_nvcsw;
}

static void step_work(thread_t *t, int step)
{
    /* blocks the previous thread made last step: cross-thread frees */
    thread_t *prev = &g_t[(t->id + g_threads - 1) % g_threads];
    list_free_all(&prev->outbox[(step + 1) & 1]);
    list_t *ring = &t->ring[step % g_hold];
    list_free_all(ring);
    list_t *out = &t->outbox[step & 1];
    for (long i = 0; i < t->nseq; i++) {
        char *p = malloc(t->seq[i]);
        if (!p)
            die("malloc returned NULL");
        touch(p, t->seq[i]);
        list_t *dest = t->kind[i] == 1 ? ring : t->kind[i] == 2 ? out : &t->step_live;
        dest->p[dest->n++] = p;
    }
    /* the step's temporaries go in the order they were made, as ops finish */
    list_free_all(&t->step_live);
}

/* closes the previous JSON array and writes the per-step series `name` */
static void print_counts(const char *name, const long *v)
{
    printf("], \"%s\": [", name);
    for (int s = 0; s < g_steps; s++)
        printf("%s%ld", s ? ", " : "", v[s]);
}

static void *worker(void *arg)
{
    thread_t *t = arg;
    for (int step = 0; step < g_steps; step++) {
        pthread_barrier_wait(&g_start);
        long iv0, iv1;
        long v0 = thread_switches(&iv0);
        step_work(t, step);
        long v1 = thread_switches(&iv1);
        __atomic_add_fetch(&g_vcs[step], v1 - v0, __ATOMIC_RELAXED);
        __atomic_add_fetch(&g_ivcs[step], iv1 - iv0, __ATOMIC_RELAXED);
        pthread_barrier_wait(&g_end);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 4)
        die("usage: scaling_replay PATTERN THREADS STEPS [HOLD_STEPS] [CROSS_PERCENT]");
    read_pattern(argv[1]);
    g_threads = atoi(argv[2]);
    g_steps = atoi(argv[3]);
    if (argc > 4)
        g_hold = atoi(argv[4]);
    if (argc > 5)
        g_cross = atoi(argv[5]);
    if (g_threads < 1 || g_threads > MAX_THREADS || g_steps < 1 || g_hold < 1 || g_hold > MAX_HOLD || g_cross < 0 ||
        g_cross > 100)
        die("THREADS 1..1024, STEPS >= 1, HOLD_STEPS 1..64, CROSS_PERCENT 0..100");
    g_page = sysconf(_SC_PAGESIZE);
    void (*mark)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "rtkit_step_mark");
    int (*state)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "rtkit_malloc_state");
    int (*write_stats)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "rtkit_malloc_write_stats");
    g_t = calloc((size_t)g_threads, sizeof *g_t);
    g_vcs = calloc((size_t)g_steps, sizeof *g_vcs);
    g_ivcs = calloc((size_t)g_steps, sizeof *g_ivcs);
    double *ms = calloc((size_t)g_steps, sizeof *ms);
    long *faults = calloc((size_t)g_steps, sizeof *faults);
    if (!g_t || !g_vcs || !g_ivcs || !ms || !faults)
        die("out of memory");
    for (int i = 0; i < g_threads; i++) {
        g_t[i].id = i;
        thread_setup(&g_t[i]);
    }
    pthread_barrier_init(&g_start, NULL, (unsigned)g_threads + 1);
    pthread_barrier_init(&g_end, NULL, (unsigned)g_threads + 1);
    pthread_t *tid = xmalloc(sizeof(pthread_t) * (size_t)g_threads);
    for (int i = 0; i < g_threads; i++)
        if (pthread_create(&tid[i], NULL, worker, &g_t[i]) != 0)
            die("pthread_create failed");
    /* the main thread is the step driver (a training loop's Session.run caller): it times and marks each step */
    for (int step = 0; step < g_steps; step++) {
        long f0 = bench_minor_faults();
        double t0 = bench_now_s();
        pthread_barrier_wait(&g_start);
        pthread_barrier_wait(&g_end);
        if (mark)
            mark();
        ms[step] = (bench_now_s() - t0) * 1e3;
        faults[step] = bench_minor_faults() - f0;
    }
    for (int i = 0; i < g_threads; i++)
        pthread_join(tid[i], NULL);
    for (int i = 0; i < g_threads; i++) {
        list_free_all(&g_t[i].outbox[0]);
        list_free_all(&g_t[i].outbox[1]);
        for (int h = 0; h < g_hold; h++)
            list_free_all(&g_t[i].ring[h]);
    }
    int st = state ? state() : -1;
    if (write_stats)
        write_stats();
    printf("{\"threads\": %d, \"steps\": %d, \"hold_steps\": %d, \"cross_percent\": %d, \"rtkit_state\": %d, "
           "\"step_ms\": [", g_threads, g_steps, g_hold, g_cross, st);
    for (int s = 0; s < g_steps; s++)
        printf("%s%.4f", s ? ", " : "", ms[s]);
    print_counts("minor_faults", faults);
    print_counts("voluntary_switches", g_vcs);
    print_counts("involuntary_switches", g_ivcs);
    printf("]}\n");
    return 0;
}
