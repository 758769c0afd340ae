/* prmalloc_tier.c -- PMEM tier mode under LD_PRELOAD: what lands in the pool, frees/realloc, fork, pool full.
 * Usage: prmalloc_tier basic|full|plain|heads|heads_heat|heads_race|churn|small|double_free|realloc_freed (RTKIT_TIER_POOL_PATH, RTKIT_RUN_DIR
 * set by the caller). */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prmalloc_test.h"

typedef int (*in_pmem_fn)(const void *);
typedef int (*write_fn)(void);
static in_pmem_fn t_in_pmem;
static write_fn t_write;

/* How p is mapped, per /proc/self/maps: 's' in a shared mapping of the file named by RTKIT_TIER_POOL_PATH (the
 * pool's), 'p' in a private mapping of it (a DRAM head, or a forked child's view), 0 elsewhere */
static int pool_mapping(const void *p)
{
    const char *path = getenv("RTKIT_TIER_POOL_PATH");
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f || !path)
        return 0;
    char line[4096];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3)
            continue;
        if ((uintptr_t)p >= lo && (uintptr_t)p < hi && strstr(line, path))
            found = perms[3];
    }
    fclose(f);
    return found;
}

static int in_pool_file(const void *p) { return pool_mapping(p) == 's'; }

static long long stats_figure(const char *key) { return t_pmem_figure(key); }

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i += 97)
        p[i] = (unsigned char)(seed + i);
}

static int same(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i += 97)
        if (p[i] != (unsigned char)(seed + i))
            return 0;
    return 1;
}

static void *thread_body(void *arg)
{
    /* before the first step mark: pool records allocated and freed from several threads */
    void *keep[40];
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < 40; i++) {
            keep[i] = malloc((size_t)(128 << 10) + (size_t)i * 4096);
            if (keep[i])
                fill(keep[i], 128 << 10, (unsigned)i);
        }
        for (int i = 0; i < 40; i++) {
            CHECK(keep[i] && t_in_pmem(keep[i]));
            CHECK(same(keep[i], 128 << 10, (unsigned)i));
            free(keep[i]);
        }
    }
    return arg;
}

static int basic(void)
{
    /* (a) before the first step mark: large allocations go to the pool, small ones do not */
    unsigned char *w = malloc(1 << 20);
    void *al = NULL;
    CHECK(posix_memalign(&al, 64, 256 << 10) == 0);
    unsigned char *z = calloc(200, 1024);
    unsigned char *small = malloc(1000), *mid = malloc(32 << 10);
    CHECK(w && al && z && small && mid);
    CHECK(t_in_pmem(w) && in_pool_file(w));
    CHECK(t_in_pmem(al) && in_pool_file(al) && ((uintptr_t)al % 64) == 0);
    CHECK(t_in_pmem(z));
    CHECK(!t_in_pmem(small) && !in_pool_file(small));
    CHECK(!t_in_pmem(mid) && !in_pool_file(mid));
    int zero = 1;
    for (size_t i = 0; i < 200 * 1024; i++)
        zero &= z[i] == 0;
    CHECK(zero);
    void *pg = aligned_alloc(4096, 100 << 10);
    CHECK(pg && t_in_pmem(pg) && ((uintptr_t)pg % 4096) == 0);
    free(pg);
    CHECK(malloc_usable_size(w) >= (1u << 20));
    fill(w, 1 << 20, 7);

    /* realloc: grow (still before the first mark: stays in the pool), shrink in place, shrink out to DRAM */
    w = realloc(w, 2 << 20);
    CHECK(w && t_in_pmem(w) && same(w, 1 << 20, 7));
    unsigned char *w2 = realloc(w, 1536 << 10);
    CHECK(w2 == w);
    w = realloc(w2, 100);
    CHECK(w && !t_in_pmem(w) && same(w, 100, 7));
    free(w);

    /* C++-style and memalign paths and many frees */
    free(al);
    free(z);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, thread_body, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);

    /* parameters that stay: one written before fork, checked after the child scribbled on its copy */
    unsigned char *param = malloc(3 << 20);
    CHECK(param && t_in_pmem(param));
    fill(param, 3 << 20, 3);
    pid_t pid = fork();
    if (pid == 0) {
        int ok = t_in_pmem(param) && same(param, 3 << 20, 3);
        memset(param, 0xEE, 3 << 20);  /* private copy: the parent must not see this */
        free(param);                   /* ignored in the child: the records are the parent's */
        void *c = malloc(1 << 20);     /* a child allocates from DRAM */
        ok &= c != NULL && !t_in_pmem(c);
        free(c);
        _exit(ok ? 0 : 3);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(same(param, 3 << 20, 3));

    /* steps: temporaries made after the first mark stay in DRAM */
    t_mark();
    for (int s = 0; s < 3; s++) {
        void *tmp = malloc(1 << 20), *tmp2 = malloc(300 << 10);
        CHECK(tmp && tmp2 && !t_in_pmem(tmp) && !t_in_pmem(tmp2) && !in_pool_file(tmp));
        free(tmp);
        free(tmp2);
        t_mark();
    }
    /* (b) a size seen to outlive steps while profiling is placed in the pool once the plan exists */
    int steps = 0;
    void *ll = NULL;
    while (t_state() != 3 && steps < 40) {
        void *tmp = malloc(1 << 20);
        CHECK(tmp && !t_in_pmem(tmp));
        if (t_state() == 2 && !ll)
            ll = malloc(777777);  /* made while profiling and kept */
        free(tmp);
        t_mark();
        steps++;
    }
    CHECK(t_state() == 3);
    CHECK(ll && !t_in_pmem(ll));
    /* the arena's blocks come first (reserved DRAM either way); once they are taken, the pool */
    void *more[8], *other[8];
    int placed = 0, others = 0;
    for (int i = 0; i < 8; i++) {
        more[i] = malloc(777777);
        other[i] = malloc(888888);  /* a size never seen outliving a step */
        CHECK(more[i] && other[i]);
        placed += t_in_pmem(more[i]);
        others += t_in_pmem(other[i]);
    }
    CHECK(placed >= 1 && others == 0);
    for (int i = 0; i < 8; i++) {
        free(more[i]);
        free(other[i]);
    }
    free(ll);
    free(small);
    free(mid);
    CHECK(t_write() == 0);
    free(param);
    return test_done("prmalloc_tier basic");
}

/* pool of a few segments: the first allocations fill it, the rest fall back to DRAM and still work */
static int full(void)
{
    void *p[16];
    int in = 0, out = 0;
    for (int i = 0; i < 16; i++) {
        p[i] = malloc(1000000);
        CHECK(p[i] != NULL);
        if (!p[i])
            continue;
        memset(p[i], i, 1000000);
        if (t_in_pmem(p[i]))
            in++;
        else
            out++;
    }
    CHECK(in >= 1 && out >= 1);
    for (int i = 0; i < 16; i++)
        if (p[i]) {
            CHECK(((unsigned char *)p[i])[999999] == (unsigned char)i);
            free(p[i]);
        }
    void *again = malloc(1000000);  /* room again after the frees */
    CHECK(again && t_in_pmem(again));
    free(again);
    t_mark();
    CHECK(t_write() == 0);
    fprintf(stderr, "full: %d in the pool, %d in DRAM\n", in, out);
    return test_done("prmalloc_tier full");
}

/* bad or busy path: everything works from DRAM */
static int plain(void)
{
    void *p = malloc(4 << 20);
    CHECK(p && !t_in_pmem(p));
    memset(p, 1, 4 << 20);
    free(p);
    t_mark();
    if (getenv("RTKIT_RUN_DIR"))
        CHECK(t_write() == 0);
    return test_done("prmalloc_tier plain");
}

/* RTKIT_TIER_DRAM_HEAD set by the caller (4 MiB): at the first mark the leading share of each big record becomes a
 * private mapping of the pool file, with its data (written rows and holes alike), and the pages a step writes there
 * the process's own; fork gives the child its own copy of heads and pool; a freed record's head goes back to the
 * shared file (the next record placed there is the pool's). */
static int heads(void)
{
    size_t n = 8 << 20;
    unsigned char *a = malloc(n), *b = malloc(n);
    CHECK(a && b && t_in_pmem(a) && t_in_pmem(b) && in_pool_file(a + 4096) && in_pool_file(b + n - 1));
    /* a few "rows" written before the first step, the rest left as holes */
    for (size_t off = 0; off < n; off += 3 << 20)
        fill(a + off, 64 << 10, (unsigned)off);
    memset(b, 7, n);
    /* a child forked before the mark keeps reading the file through its private view: the mark must leave the
     * file's data under the heads as it is */
    int go[2];
    CHECK(pipe(go) == 0);
    pid_t early = fork();
    if (early == 0) {
        char c;
        close(go[1]);
        if (read(go[0], &c, 1) != 1)
            _exit(2);
        int ok = b[0] == 7 && b[(1 << 20) + 9] == 7 && b[n - 1] == 7 && same(a, 64 << 10, 0);
        for (size_t off = 0; ok && off < n; off += 4096)
            ok = b[off] == 7;
        _exit(ok ? 0 : 1);
    }
    close(go[0]);
    t_mark();
    CHECK(t_write() == 0);  /* the first residency sample: heads made, records live */
    CHECK(write(go[1], "g", 1) == 1);
    close(go[1]);
    int est = -1;
    CHECK(early > 0 && waitpid(early, &est, 0) == early && WIFEXITED(est) && WEXITSTATUS(est) == 0);
    /* the head: 2 MiB of each (4 MiB over 16 MiB of records, a quarter each), the rest still the file's */
    CHECK(pool_mapping(a + 8192) == 'p' && pool_mapping(b + (1 << 20)) == 'p' && in_pool_file(a + (3 << 20)));
    for (size_t off = 0; off < n; off += 3 << 20)
        CHECK(same(a + off, 64 << 10, (unsigned)off));
    CHECK(a[(1 << 20) + 5] == 0 && b[0] == 7 && b[(1 << 20) + 9] == 7 && b[n - 1] == 7);
    memset(a, 9, 1 << 20);  /* a step writes hot rows */
    CHECK(t_write() == 0);
    /* what it wrote of a's head is the process's own now (a's first 1 MiB less the page the head starts past),
     * and nothing else of the heads */
    long long written = stats_figure("\"written_bytes\": "), peak = stats_figure("\"written_peak_bytes\": ");
    CHECK(written >= (1 << 20) - 4096 && written <= (1 << 20) && peak == written);
    pid_t pid = fork();
    if (pid == 0) {
        /* the child's whole view of the pool is private: its writes stay its own */
        int ok = a[100] == 9 && b[n - 1] == 7 && pool_mapping(a + 8192) == 'p' && pool_mapping(a + (3 << 20)) == 'p';
        memset(a, 1, 1 << 20);  /* the child's own copy: head ... */
        memset(a + (5 << 20), 1, 4096);  /* ... and pool pages */
        _exit(ok ? 0 : 1);
    }
    int st = -1;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(a[100] == 9 && a[(5 << 20) + 1] == 0);
    uintptr_t a_head = (uintptr_t)a + 8192;
    free(a);
    CHECK(in_pool_file((void *)a_head));  /* the pool's again, for the next record placed there */
    free(b);
    CHECK(t_write() == 0);
    return test_done("prmalloc_tier heads");
}

/* RTKIT_TIER_DRAM_HEAD=8M, RTKIT_TIER_HEAT_EVERY=1 and RTKIT_TIER_HEAT_WORKER=0 set by the caller: two 8 MiB tables,
 * one whose every page each step writes and one no step writes. The first mark's leading shares take half of the
 * budget (2 MiB of each table); the heat passes give the other half to the written table's chunks past its head
 * (heat 0xC0: written at two samples running), none to the other. Data stays; a forked child sees the parent's
 * rows there, not the file's older ones; a free gives them back to the file. */
static int heads_heat(void)
{
    size_t n = 8 << 20;
    unsigned char *hot = malloc(n), *cold = malloc(n);
    CHECK(hot && cold && t_in_pmem(hot) && t_in_pmem(cold));
    memset(hot, 1, n);
    memset(cold, 2, n);
    for (int step = 0; step < 6; step++) {
        t_mark();
        for (size_t off = 0; off < n; off += 4096)
            hot[off] = (unsigned char)(10 + step);
    }
    CHECK(pool_mapping(hot + (3 << 20)) == 'p' && pool_mapping(hot + (5 << 20)) == 'p');
    CHECK(pool_mapping(hot + n - 4096) == 's');                       /* past the budget */
    CHECK(pool_mapping(cold + (3 << 20)) == 's' && pool_mapping(cold + 4096) == 'p');  /* its head only */
    int ok = 1;
    for (size_t off = 0; off < n; off += 4096)
        ok &= hot[off] == 15 && hot[off + 1] == 1 && cold[off] == 2;
    CHECK(ok);
    CHECK(t_write() == 0);
    CHECK(stats_figure("\"by_heat\": {\"bytes\": ") == 4 << 20);
    pid_t pid = fork();
    if (pid == 0) {
        int good = hot[3 << 20] == 15 && hot[(3 << 20) + 1] == 1 && hot[n - 4096] == 15 && cold[3 << 20] == 2;
        hot[3 << 20] = 99;  /* its own copy */
        _exit(good ? 0 : 1);
    }
    int st = -1;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(hot[3 << 20] == 15);
    uintptr_t promoted = (uintptr_t)hot + (3 << 20);
    free(hot);
    CHECK(in_pool_file((void *)promoted));  /* the pool's again */
    free(cold);
    CHECK(t_write() == 0);
    return test_done("prmalloc_tier heads_heat");
}

/* A writer thread keeps updating a table (as a parameter server's update RPCs, or the other threads of a Hogwild
 * trainer, do while one thread marks a step) through the first step mark that makes the DRAM heads: every update
 * must be in the table afterwards, whether it landed before, during or after the head was made. */
typedef struct { uint64_t *table; size_t pages; volatile int stop; uint64_t updates, progress; } racer_t;

static void *head_racer(void *arg)
{
    racer_t *r = arg;
    uint64_t n = 0;
    for (size_t i = 0; !r->stop; i = (i + 7919) % r->pages, n++) {
        __atomic_add_fetch(&r->table[i * 512], 1, __ATOMIC_RELAXED);
        if (!(n & 1023))
            __atomic_store_n(&r->progress, n, __ATOMIC_RELAXED);
    }
    r->updates = n;
    return NULL;
}

/* until the writer has written every page of the table twice more (7919 and the page count share no factor) */
static void racer_laps(racer_t *r)
{
    uint64_t from = __atomic_load_n(&r->progress, __ATOMIC_RELAXED);
    while (__atomic_load_n(&r->progress, __ATOMIC_RELAXED) < from + 2 * r->pages + 1024)
        ;
}

static int heads_race(void)
{
    size_t pages = (64u << 20) / 4096;
    racer_t r = {malloc(pages * 4096), pages, 0, 0, 0};
    CHECK(r.table && t_in_pmem(r.table));
    memset(r.table, 0, pages * 4096);  /* initialisation: every page of the table in the file */
    pthread_t th;
    CHECK(pthread_create(&th, NULL, head_racer, &r) == 0);
    racer_laps(&r);
    t_mark();  /* the heads: the whole table (or half, with heat), while the writer runs */
    for (int i = 0; i < 3; i++) {
        racer_laps(&r);  /* every chunk written between marks: hot to the heat passes, which promote them */
        t_mark();
    }
    r.stop = 1;
    pthread_join(th, NULL);
    uint64_t sum = 0;
    for (size_t i = 0; i < pages; i++)
        sum += r.table[i * 512];
    if (sum != r.updates)
        fprintf(stderr, "heads_race: %llu updates, %llu in the table\n", (unsigned long long)r.updates,
                (unsigned long long)sum);
    CHECK(sum == r.updates);
    CHECK(t_write() == 0);
    free(r.table);
    return test_done("prmalloc_tier heads_race");
}

/* Before any step mark: 320 MiB of 1 MiB records placed and freed (churn) stops placement for what follows,
 * but for table-sized requests: an initialised table reaches the allocator after temporaries of its size. */
static int churn(void)
{
    for (int i = 0; i < 320; i++) {
        void *t = malloc(1 << 20);
        CHECK(t && (i >= 256 || t_in_pmem(t)));  /* placement stops once 256 MiB were freed */
        memset(t, i, 4096);
        free(t);
    }
    unsigned char *after = malloc(1 << 20), *table = malloc(64u << 20);
    CHECK(after && table);
    CHECK(!t_in_pmem(after));
    CHECK(t_in_pmem(table) && in_pool_file(table));
    fill(table, 64u << 20, 7);
    CHECK(t_write() == 0);
    free(after);
    free(table);
    return test_done("prmalloc_tier churn");
}

/* RTKIT_TIER_MIN_SIZE set by the caller (256): 8192 records of 1,500 bytes, packed so that most pages hold parts of
 * two records, all written, then three steps; the caller compares the report's pool pages in DRAM with the bytes */
static int small(void)
{
    enum { N = 8192, SIZE = 1500 };
    static unsigned char *rec[N];
    for (int i = 0; i < N; i++) {
        CHECK((rec[i] = malloc(SIZE)) && t_in_pmem(rec[i]));
        memset(rec[i], i & 0xff, SIZE);
    }
    for (int s = 0; s < 3; s++)
        t_mark();
    CHECK(t_write() == 0);
    for (int i = 0; i < N; i++)
        free(rec[i]);
    return test_done("prmalloc_tier small");
}

/* the program's bug on a pool block: glibc aborts on it, so must rtkit (the caller expects SIGABRT and one line);
 * "survived" is printed only when it did not */
static int bad_free(int then_realloc)
{
    void *p = malloc(1 << 20);
    CHECK(p && t_in_pmem(p));
    free(p);
    fflush(NULL);
    if (then_realloc)
        p = realloc(p, 2 << 20);
    else
        free(p);
    printf("survived\n");
    return test_done(then_realloc ? "prmalloc_tier realloc_freed" : "prmalloc_tier double_free");
}

int main(int argc, char **argv)
{
    test_bind();
    t_in_pmem = (in_pmem_fn)dlsym(RTLD_DEFAULT, "rtkit_malloc_in_pmem");
    t_write = (write_fn)dlsym(RTLD_DEFAULT, "rtkit_malloc_write_stats");
    if (!t_in_pmem || !t_write) {
        fprintf(stderr, "FAIL: librtkit_malloc.so without tier mode\n");
        return 2;
    }
    const char *mode = argc > 1 ? argv[1] : "basic";
    if (!strcmp(mode, "full"))
        return full();
    if (!strcmp(mode, "plain"))
        return plain();
    if (!strcmp(mode, "heads"))
        return heads();
    if (!strcmp(mode, "heads_heat"))
        return heads_heat();
    if (!strcmp(mode, "heads_race"))
        return heads_race();
    if (!strcmp(mode, "churn"))
        return churn();
    if (!strcmp(mode, "small"))
        return small();
    if (!strcmp(mode, "double_free") || !strcmp(mode, "realloc_freed"))
        return bad_free(!strcmp(mode, "realloc_freed"));
    return basic();
}
