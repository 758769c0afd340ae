/* prmalloc_unit_min_size.c -- a loaded plan's min_size is the one in force (rtk_fastpath) and the one the settings
 * echo shows, while the value array keeps what the user set. Linked against the sources (-DRTK_NO_INTERPOSE); run
 * with RTKIT_MALLOC_PLAN naming a plan whose min_size differs from the setting (tests/test_prmalloc_plan.py).
 * Usage: prmalloc_unit_min_size SET_BYTES PLAN_BYTES */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/options.h"
#include "prmalloc/state.h"
#include "prmalloc/stats.h"
#include "rtkit/prmalloc.h"

void *rtk_api_malloc(size_t);
void rtk_api_free(void *);

static int g_failures;
#define CHECK(cond) do { if (!(cond)) { fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
                                         g_failures++; } } while (0)

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: prmalloc_unit_min_size SET_BYTES PLAN_BYTES\n");
        return 2;
    }
    size_t set = strtoull(argv[1], NULL, 10), planned = strtoull(argv[2], NULL, 10);
    /* steps of the plan's sizes until the deferred plan is installed (at the warm-up's end) */
    for (int i = 0; i < 4 && (!rtk_engine.plan_source || strcmp(rtk_engine.plan_source, "loaded")); i++) {
        void *a = rtk_api_malloc(1 << 20), *b = rtk_api_malloc(2 << 20);
        rtk_api_free(b);
        rtk_api_free(a);
        rtkit_step_mark();
    }
    CHECK(rtk_engine.plan_source && !strcmp(rtk_engine.plan_source, "loaded"));
    CHECK(rtk_fastpath.min_size == planned);                       /* in force: the plan's */
    CHECK(rtk_setting_bytes(RTK_OPT_MALLOC_MIN_SIZE) == set);      /* the value array: the user's */
    static char buf[1 << 16];
    char want[64];
    snprintf(want, sizeof want, "\"malloc_min_size\": %zu", planned);
    CHECK(rtk_stats_format(buf, sizeof buf) > 0 && strstr(buf, want));  /* the echo: in force, as always */
    if (g_failures) {
        fprintf(stderr, "prmalloc_unit_min_size: %d check(s) failed\n", g_failures);
        return 1;
    }
    printf("prmalloc_unit_min_size: ok\n");
    return 0;
}
