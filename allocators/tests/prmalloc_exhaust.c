/* prmalloc_exhaust.c -- a class exhausted after the plan, every step: the recurring fallbacks (served by the
 * large-object heap, or by the fallback stash when it is off) must stop faulting. */
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>

#include "prmalloc_test.h"

#define BLOCK ((size_t)2 << 20)
#define EXTRA 3  /* blocks live beyond the plan's one, from step 10 on */

static long minor_faults(void)
{
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_minflt;
}

int main(void)
{
    test_bind();
    long worst = 0;
    for (int step = 0; step < 24; step++) {
        long f0 = minor_faults();
        void *a = malloc(BLOCK), *extra[EXTRA] = {0};
        memset(a, 1, BLOCK);
        for (int k = 0; step >= 10 && k < EXTRA; k++) {
            extra[k] = malloc(BLOCK);  /* the class has one block: these fall back */
            CHECK(extra[k] != NULL);
            memset(extra[k], 2, BLOCK);
        }
        free(a);
        for (int k = 0; k < EXTRA; k++)
            free(extra[k]);
        t_mark();
        long f = minor_faults() - f0;
        if (step >= 12 && f > worst)
            worst = f;  /* step 10 faults the fallbacks in once; from then on they are kept */
    }
    CHECK(t_state() == 3);
    if (worst > 16)
        fprintf(stderr, "FAIL: %ld minor faults in a step with recurring fallbacks (3 x 2 MiB = 1536 pages)\n", worst);
    CHECK(worst <= 16);
    return test_done("prmalloc_exhaust");
}
