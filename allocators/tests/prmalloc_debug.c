/* prmalloc_debug.c -- RTKIT_MALLOC_DEBUG=1 keeps the always-on checks: a double free of an arena block aborts
 * with one line naming the address, and never hands the block out twice. Run under LD_PRELOAD. */
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
    fprintf(stderr, "freeing %p twice\n", a);
    free(a);
    free(a);                   /* double free: aborts */
    void *b = malloc(1 << 20), *c = malloc(1 << 20);
    printf("survived a double free%s\n", b == c ? ": one block handed out twice" : "");
    return 1;
}
