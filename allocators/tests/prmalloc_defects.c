/* prmalloc_defects.c -- one reproducer per plan, arena and free-path invariant, chosen by argv[1]; run under
 * LD_PRELOAD with the FAST plan settings of test_prmalloc.py. Cases that must abort print what went wrong
 * when they survive; the others print "prmalloc_defects CASE: ok". */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>

#include "prmalloc_test.h"

#define MiB ((size_t)1 << 20)

static long minor_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

static long rss_anon_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %ld", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

/* one step: 1 MiB + 2 MiB + 300 KiB blocks, touched, freed, then the step mark */
static void one_step(void)
{
    void *a = malloc(MiB), *b = malloc(2 * MiB), *c = malloc(300 << 10);
    memset(a, 1, MiB);
    memset(b, 1, 2 * MiB);
    memset(c, 1, 300 << 10);
    free(c);
    free(b);
    free(a);
    t_mark();
}

/* steps until the allocator has a plan */
static void plan_now(void)
{
    for (int i = 0; i < 20 && t_state() != 3; i++)
        one_step();
    CHECK(t_state() == 3);
}

static void *arena_block(void)
{
    void *p = malloc(MiB);
    CHECK(p && t_in_arena(p));
    return p;
}

/* 1: growing a glibc block past min_size once planned must stay as cheap as glibc's in-place growth */
static void realloc_cliff(void)
{
    plan_now();
    long f0 = minor_faults();
    char *p = malloc(8 << 10);
    for (size_t n = 16 << 10; n <= 8 * MiB; n += 8 << 10) {
        p = realloc(p, n);
        p[n - 1] = 1;
    }
    free(p);
    long faults = minor_faults() - f0;
    fprintf(stderr, "realloc growth to 8 MiB: %ld minor faults\n", faults);
    CHECK(faults < 20000);
}

/* 2: a double free must abort, never hand the block to two callers */
static void double_free(void)
{
    plan_now();
    void *p = arena_block();
    free(p);
    free(p);
    void *q = malloc(MiB), *r = malloc(MiB);
    printf("survived a double free%s\n", q == r ? ": the same block was handed out twice" : "");
}

/* 3: freeing an interior pointer must abort, not leak the block silently */
static void interior_free(void)
{
    plan_now();
    char *p = arena_block();
    free(p + 4096);
    printf("survived a free of an interior pointer\n");
}

/* 4: a recurring allocation aligned above a page must be served from rtkit's memory once planned */
static void big_align(void)
{
    for (int i = 0; i < 20; i++) {
        void *p = NULL, *q = malloc(MiB);
        CHECK(posix_memalign(&p, 64 << 10, 4 * MiB) == 0 && ((uintptr_t)p & 0xffff) == 0);
        memset(p, 1, 4 * MiB);
        memset(q, 1, MiB);
        if (i >= 12)
            CHECK(t_in_arena(p));
        free(q);
        free(p);
        t_mark();
    }
    CHECK(t_state() == 3);
}

/* 5: after a loaded plan is rejected (test passes a large mismatching plan) its arena must not stay resident */
static void retired_rss(void)
{
    for (int i = 0; i < 12; i++) {
        void *p = malloc(5 * MiB);
        memset(p, 1, 5 * MiB);
        free(p);
        t_mark();
    }
    long kib = rss_anon_kib();
    fprintf(stderr, "RssAnon after the rejection: %ld KiB\n", kib);
    CHECK(kib > 0 && kib < 100 * 1024);
}

/* 5b: sizes drift after the plan: a second plan and a second retirement; the new sizes end up in rtkit memory */
static void drift(void)
{
    plan_now();
    int served = 0;
    for (int i = 0; i < 30; i++) {
        void *a = malloc(5 * MiB), *b = malloc(7 * MiB);
        memset(a, 1, 5 * MiB);
        memset(b, 1, 7 * MiB);
        if (i >= 20)
            served += t_in_arena(a) && t_in_arena(b);
        free(b);
        free(a);
        t_mark();
    }
    CHECK(served == 10);
}

/* RTKIT_MALLOC_DEBUG=1: a write to a freed arena block is reported when the block is handed out again */
static void write_after_free(void)
{
    plan_now();
    char *p = arena_block();
    free(p);
    p[8] = 42;  /* the program's bug: a write after free */
    char *q = malloc(MiB);
    CHECK(q == p);  /* LIFO: the same block again */
    free(q);
}

/* plan reuse: the job takes blocks of its step sizes before its first step and keeps them (weights, caches);
 * a job's own plan must still be accepted on its next run */
static void held_before_steps(void)
{
    void *keep[3] = {malloc(MiB), malloc(2 * MiB), malloc(300 << 10)};
    for (int i = 0; i < 3; i++)
        memset(keep[i], 1, 300 << 10);
    for (int i = 0; i < 12; i++)
        one_step();
    for (int i = 0; i < 3; i++)
        free(keep[i]);
    CHECK(t_state() == 3);
}

/* 7: the entry points a complete malloc has. cfree is bound as an old binary binds it: a reference to the
 * versioned cfree@GLIBC_2.2.5 (glibc no longer declares it; its compat definition aborts on rtkit's memory) */
extern void cfree_compat(void *);
__asm__(".symver cfree_compat,cfree@GLIBC_2.2.5");

static void cfree_case(void)
{
    plan_now();
    void (*cf)(void *) = cfree_compat;
    CHECK(cf != NULL);
    Dl_info info;
    CHECK(cf && dladdr((void *)cf, &info) && info.dli_fname && strstr(info.dli_fname, "rtkit"));
    void *p = arena_block();
    if (cf)
        cf(p);  /* glibc's cfree aborts on an arena pointer */
}

static void mallinfo_case(void)
{
    plan_now();
    void *held[2];
    for (int i = 0; i < 2; i++) {
        held[i] = arena_block();
        memset(held[i], 1, MiB);
    }
    struct mallinfo2 mi = mallinfo2();
    fprintf(stderr, "mallinfo2: uordblks %zu hblkhd %zu arena %zu\n", mi.uordblks, mi.hblkhd, mi.arena);
    CHECK(mi.uordblks + mi.hblkhd >= 2 * MiB);
    CHECK(mi.arena + mi.hblkhd >= 2 * MiB);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(malloc_info(0, f) == 0);
    fclose(f);
    CHECK(buf && strstr(buf, "rtkit") != NULL);
    free(buf);
    CHECK(mallopt(M_TRIM_THRESHOLD, 1 << 20) == 1);
    for (int i = 0; i < 2; i++)
        free(held[i]);
}

static void trim_case(void)
{
    plan_now();
    /* idle large-heap pages of a size no class holds (the planned sizes' pages are the classes' blocks now) */
    void *idle = malloc(5 * MiB);
    memset(idle, 3, 5 * MiB);
    free(idle);
    long before = rss_anon_kib();
    malloc_trim(0);
    long after = rss_anon_kib();
    fprintf(stderr, "RssAnon around malloc_trim: %ld -> %ld KiB\n", before, after);
    CHECK(before - after >= 4 * 1024);  /* at least the idle 5 MiB block goes back */
    void *p = malloc(2 * MiB);          /* and the memory still works afterwards */
    memset(p, 2, 2 * MiB);
    free(p);
}

static void free_sized_case(void)
{
    plan_now();
    void (*fs)(void *, size_t) = (void (*)(void *, size_t))dlsym(RTLD_DEFAULT, "free_sized");
    void (*fas)(void *, size_t, size_t) = (void (*)(void *, size_t, size_t))dlsym(RTLD_DEFAULT, "free_aligned_sized");
    CHECK(fs && fas);
    if (!fs || !fas)
        return;
    fs(arena_block(), MiB);
    fs(malloc(100), 100);
    void *p = aligned_alloc(4096, 8192);
    fas(p, 4096, 8192);
}

/* 8: the profiler's table has room for 49152 live allocations; more must be counted, not lost silently
 * (run with RTKIT_MALLOC_MIN_SIZE=64) */
static void profiler_overflow(void)
{
    enum { N = 60000 };
    static void *p[N];
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < N; i++)
            p[i] = malloc(128);
        for (int i = 0; i < N; i++)
            free(p[i]);
        t_mark();
    }
}

/* The small objects left to glibc grow its thread heaps every step: each heap glibc grows is advised for huge
 * pages (VmFlags "hg"), and is writable whole from its creation (M_TOP_PAD), so a 2 MiB page can back its growth. */
static void *glibc_thp_worker(void *arg)
{
    void **keep = arg;
    for (int i = 0; i < 4096; i++)
        keep[i] = malloc(200);  /* 800 KiB of small blocks: dozens of sampled mallocs */
    return NULL;
}

static void glibc_thp(void)
{
    static void *keep[4096];
    pthread_t t;
    pthread_create(&t, NULL, glibc_thp_worker, keep);
    pthread_join(t, NULL);
    uintptr_t p = (uintptr_t)keep[4095];
    if ((((size_t *)p)[-1] & 4) == 0) {
        printf("the thread's blocks are in glibc's main heap\n");
        return;
    }
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int in = 0, hg = -1;
    unsigned long lo, hi;
    char perms[8] = "";
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && strchr(line, ' ')) {
            in = p >= lo && p < hi;
            if (in && perms[0] != 'r')
                in = 0;
        } else if (in && !strncmp(line, "VmFlags:", 8)) {
            hg = strstr(line, " hg") != NULL;
            in = 0;
        }
    }
    if (f)
        fclose(f);
    if (hg != 1)
        printf("thread heap at %#lx not advised for huge pages (hg=%d)\n", (unsigned long)p, hg);
    /* writable whole: the mapping holding the heap runs to its 64 MiB end (2 * glibc's largest mmap threshold) */
    uintptr_t heap = p & ~(uintptr_t)((64 << 20) - 1);
    f = fopen("/proc/self/maps", "r");
    int whole = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && p >= lo && p < hi)
            whole = lo == heap && hi == heap + (64 << 20) && perms[1] == 'w';
    if (f)
        fclose(f);
    if (!whole)
        printf("thread heap at %#lx not writable whole\n", (unsigned long)heap);
    for (int i = 0; i < 4096; i++)
        free(keep[i]);
}

/* A plan's classes are made of the large heap's resident pages (a fresh span pre-faulted at the planning mark
 * would sit beside the heap's idle pages, scattered between live blocks and still resident). Steps of eight 1-4 MiB blocks; in the first steps, before profiling starts (run with
 * RTKIT_MALLOC_PROFILE_START=3), each big block is followed by a small block of a new size that stays live, so
 * the idle extents are scattered. Anonymous RSS from just before the planning mark to three steps after it must
 * grow by far less than the classes hold: their blocks are the pages the heap already holds. */
static long g_rss_mark, g_faults_mark;

static void step_scattered(void **keep, int *nkeep)
{
    void *big[8];
    for (int k = 0; k < 8; k++) {
        big[k] = malloc((size_t)(1 + k % 4) * MiB);
        memset(big[k], 1, (size_t)(1 + k % 4) * MiB);
        if (keep) {
            keep[*nkeep] = malloc((size_t)(40 + 4 * *nkeep) << 10);
            memset(keep[*nkeep], 1, 4096);
            ++*nkeep;
        }
    }
    for (int k = 0; k < 8; k++)
        free(big[k]);
    g_rss_mark = rss_anon_kib();
    g_faults_mark = minor_faults();
    t_mark();
}

static void plan_reuse(void)
{
    static void *keep[24];
    int nkeep = 0;
    for (int i = 0; i < 3; i++)
        step_scattered(keep, &nkeep);
    for (int i = 0; i < 24 && t_state() != 3; i++)
        step_scattered(NULL, NULL);
    if (t_state() != 3) {
        printf("no plan\n");
        return;
    }
    long rss0 = g_rss_mark, f0 = g_faults_mark;
    for (int i = 0; i < 3; i++)
        step_scattered(NULL, NULL);
    long grew = rss_anon_kib() - rss0, faults = minor_faults() - f0;
    /* the classes hold 20 MiB, all of it in pages the heap already has. A block that no resident extent holds
     * whole (the heap's idle pages lie in pieces) may still take a few MiB of new pages. */
    if (grew > 5 * 1024 || faults > 2048)
        printf("plan install grew RssAnon by %ld KiB with %ld minor faults\n", grew, faults);
    for (int k = 0; k < nkeep; k++)
        free(keep[k]);
}

int main(int argc, char **argv)
{
    static const struct { const char *name; void (*fn)(void); } cases[] = {
        {"realloc_cliff", realloc_cliff}, {"double_free", double_free}, {"interior_free", interior_free},
        {"big_align", big_align}, {"retired_rss", retired_rss}, {"drift", drift}, {"cfree", cfree_case},
        {"mallinfo", mallinfo_case}, {"trim", trim_case}, {"free_sized", free_sized_case},
        {"profiler_overflow", profiler_overflow}, {"held_before_steps", held_before_steps},
        {"write_after_free", write_after_free}, {"glibc_thp", glibc_thp},
        {"plan_reuse", plan_reuse},
    };
    test_bind();
    for (size_t i = 0; argc > 1 && i < sizeof cases / sizeof cases[0]; i++)
        if (!strcmp(argv[1], cases[i].name)) {
            cases[i].fn();
            char name[64];
            snprintf(name, sizeof name, "prmalloc_defects %s", argv[1]);
            return test_done(name);
        }
    fprintf(stderr, "usage: prmalloc_defects CASE\n");
    return 2;
}
