/* prmalloc_test.h -- tiny check macros and step-mark lookup shared by the PRMalloc C tests. */
#ifndef PRMALLOC_TEST_H
#define PRMALLOC_TEST_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

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
