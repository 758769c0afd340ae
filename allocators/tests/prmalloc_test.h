/* prmalloc_test.h -- tiny check macros and step-mark lookup shared by the PRMalloc C tests. */
#ifndef PRMALLOC_TEST_H
#define PRMALLOC_TEST_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_failures;

#define CHECK(cond) do { if (!(cond)) { fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
                                         g_failures++; } } while (0)

/* The preloaded allocator's exports, found in the global namespace as the Python hooks find them. */
typedef void (*mark_fn)(void);
typedef int (*state_fn)(void);
typedef int (*in_arena_fn)(const void *);

static mark_fn t_mark;
static state_fn t_state;
static in_arena_fn t_in_arena;

#ifdef PRMALLOC_TEST_LINKED
/* a program linked against the allocator's sources (prmalloc_unit_*) calls them directly */
#include "rtkit/prmalloc.h"
static void test_bind(void)
{
    t_mark = rtkit_step_mark;
    t_state = rtkit_malloc_state;
    t_in_arena = rtkit_malloc_in_arena;
}
#else
static void test_bind(void)
{
    t_mark = (mark_fn)dlsym(RTLD_DEFAULT, "rtkit_step_mark");
    t_state = (state_fn)dlsym(RTLD_DEFAULT, "rtkit_malloc_state");
    t_in_arena = (in_arena_fn)dlsym(RTLD_DEFAULT, "rtkit_malloc_in_arena");
    if (!t_mark || !t_state || !t_in_arena) {
        fprintf(stderr, "FAIL: run this test with LD_PRELOAD=librtkit_malloc.so\n");
        exit(2);
    }
}
#endif

/* A step mark and, in tier mode with the heat budget, the pass it asked for done: the passes run on the allocator's
 * worker thread, beside the steps, and a test reads their effect right after the mark. */
__attribute__((unused)) static void t_mark_pass(void)
{
    static long (*wait)(void);
    static int looked;
    if (!looked) {
        wait = (long (*)(void))dlsym(RTLD_DEFAULT, "rtkit_tier_heat_wait");
        looked = 1;
    }
    t_mark();
    if (wait)
        wait();
}

/* A 4 KiB page of a test table: its index and version in every 64-bit word, so a page read back shows whether it
 * is the one last written (the tier tests drop pages and read them back from the pool file). */
__attribute__((unused)) static void t_write_page(unsigned char *table, uint32_t *version, uint32_t i)
{
    uint64_t *w = (uint64_t *)(table + (size_t)i * 4096u), v = ((uint64_t)i << 32) | ++version[i];
    for (unsigned k = 0; k < 4096u / 8; k++)
        w[k] = v;
}

__attribute__((unused)) static int t_page_ok(const unsigned char *table, const uint32_t *version, uint32_t i)
{
    const uint64_t *w = (const uint64_t *)(table + (size_t)i * 4096u), v = ((uint64_t)i << 32) | version[i];
    for (unsigned k = 0; k < 4096u / 8; k++)
        if (w[k] != v)
            return 0;
    return 1;
}

/* Before the first step mark (placed in the pool): a table of `pages` whole pages, every one but the last written
 * ("initialisation"), and `nracers` records of 1 MiB with a pattern t_racer_ok checks (freed by the tests' racing
 * threads). NULL when the table is not in the pool. */
__attribute__((unused)) static unsigned char *t_pool_table(int (*in_pmem)(const void *), uint32_t pages,
                                                           uint32_t *version, unsigned char **racer, int nracers)
{
    unsigned char *t = (unsigned char *)malloc((size_t)pages * 4096u);
    CHECK(t && in_pmem(t));
    if (!t)
        return NULL;
    t = (unsigned char *)(((uintptr_t)t + 4095u) & ~(uintptr_t)4095u);
    for (uint32_t i = 0; i < pages - 1; i++)
        t_write_page(t, version, i);
    for (int i = 0; i < nracers; i++) {
        racer[i] = (unsigned char *)malloc(1u << 20);
        CHECK(racer[i] && in_pmem(racer[i]));
        for (size_t k = 0; racer[i] && k < (1u << 20); k += 512)
            racer[i][k] = (unsigned char)(i + k / 512);
    }
    return t;
}

__attribute__((unused)) static int t_racer_ok(const unsigned char *racer, int i)
{
    for (size_t k = 0; k < (1u << 20); k += 512)
        if (racer[k] != (unsigned char)(i + k / 512))
            return 0;
    return 1;
}

/* The number after `key` in this process's pmem-<pid>.json in RTKIT_RUN_DIR (as last written), or -1 */
__attribute__((unused)) static long long t_pmem_figure(const char *key)
{
    char path[4096], buf[1 << 16];
    snprintf(path, sizeof path, "%s/pmem-%ld.json", getenv("RTKIT_RUN_DIR"), (long)getpid());
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    const char *at = strstr(buf, key);
    return at ? strtoll(at + strlen(key), NULL, 10) : -1;
}

__attribute__((unused)) static int test_done(const char *name)
{
    if (g_failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, g_failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

#endif
