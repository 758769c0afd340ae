/* prmalloc_steps.c -- a recurring-size "training loop" for plan and census tests: each step allocates the
 * given sizes (all live together, touched), frees them and marks the step.
 * Usage: prmalloc_steps STEPS SIZE[,SIZE...]   (sizes accept K/M suffixes); prints one fixed line. */
#define _GNU_SOURCE
#include <string.h>

#include "prmalloc_test.h"

static size_t parse(const char *s, char **end)
{
    size_t v = strtoull(s, end, 10);
    if (**end == 'K' || **end == 'k') { v <<= 10; (*end)++; }
    else if (**end == 'M' || **end == 'm') { v <<= 20; (*end)++; }
    return v;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: prmalloc_steps STEPS SIZE[,SIZE...]\n");
        return 2;
    }
    test_bind();
    int steps = atoi(argv[1]);
    size_t sizes[64];
    int n = 0;
    char *s = argv[2];
    while (*s && n < 64) {
        char *end;
        sizes[n++] = parse(s, &end);
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            break;
    }
    void *live[64];
    for (int st = 0; st < steps; st++) {
        for (int i = 0; i < n; i++) {
            live[i] = malloc(sizes[i]);
            memset(live[i], i, sizes[i]);
        }
        for (int i = n - 1; i >= 0; i--)
            free(live[i]);
        t_mark();
    }
    printf("prmalloc_steps: %d steps, %d sizes, state %d\n", steps, n, t_state());
    return 0;
}
