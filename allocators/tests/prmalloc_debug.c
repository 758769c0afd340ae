/* prmalloc_debug.c -- RTKIT_MALLOC_DEBUG: a double free and an interior free of arena blocks are reported on
 * stderr and ignored (the arena stays consistent); foreign pointers still reach glibc. Run under LD_PRELOAD. */
#define _GNU_SOURCE
#include <string.h>

#include "prmalloc_test.h"

int main(void)
{
    test_bind();
    for (int i = 0; i < 10 && t_state() != 3; i++) {
        void *a = malloc(1 << 20), *b = malloc(1 << 20);
        memset(a, 1, 1 << 20);
        memset(b, 1, 1 << 20);
        free(a);
        free(b);
        t_mark();
    }
    CHECK(t_state() == 3);
    void *a = malloc(1 << 20);
    CHECK(t_in_arena(a));
    free(a);
    free(a);                   /* double free: reported, ignored */
    free((char *)a + 4096);    /* not a block start: reported, ignored */
    void *b = malloc(1 << 20), *c = malloc(1 << 20);
    CHECK(b && c && b != c);   /* the stack was not corrupted: two distinct blocks */
    CHECK(t_in_arena(b) && t_in_arena(c));
    memset(b, 2, 1 << 20);
    memset(c, 3, 1 << 20);
    free(b);
    free(c);
    return test_done("prmalloc_debug");
}
