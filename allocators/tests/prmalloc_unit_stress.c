/* prmalloc_unit_stress.c -- the allocator's own paths (census, profiler, planner, arenas) under many threads,
 * linked directly against the sources (-DRTK_NO_INTERPOSE, entry points as rtk_api_*) so it can run under
 * AddressSanitizer (build.py --asan) without preloading. Step marks come from the main thread. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rtkit/prmalloc.h"

void *rtk_api_malloc(size_t);
void rtk_api_free(void *);
void *rtk_api_calloc(size_t, size_t);
void *rtk_api_realloc(void *, size_t);
int rtk_api_posix_memalign(void **, size_t, size_t);
size_t rtk_api_malloc_usable_size(void *);

static int g_failures;
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); \
                                   __atomic_add_fetch(&g_failures, 1, __ATOMIC_RELAXED); } } while (0)

#define THREADS 6
static void *volatile g_pool[256];
static volatile int g_stop;

static uint64_t rnd(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }

static void *obj(uint64_t r)
{
    static const size_t large[] = {48 << 10, 128 << 10, 1 << 20};
    size_t n = (r & 3) == 0 ? large[(r >> 4) % 3] : 32 + (r >> 4) % 300;
    void *p = NULL;
    if ((r & 7) == 1) {
        if (rtk_api_posix_memalign(&p, 64, n))
            p = NULL;
    } else if ((r & 7) == 2) {
        p = rtk_api_calloc(1, n);
    } else {
        p = rtk_api_malloc(n);
    }
    if (p) {
        CHECK(rtk_api_malloc_usable_size(p) >= n);
        ((size_t *)p)[0] = n;
        ((size_t *)p)[1] = ~n;
        ((unsigned char *)p)[n - 1] = 0x77;
    }
    return p;
}

static void drop(void *p)
{
    if (!p)
        return;
    size_t n = ((size_t *)p)[0];
    CHECK(((size_t *)p)[1] == ~n && ((unsigned char *)p)[n - 1] == 0x77);
    ((size_t *)p)[1] = 0;
    rtk_api_free(p);
}

static void *worker(void *arg)
{
    uint64_t s = (uintptr_t)arg * 2654435761u + 11;
    void *mine[16] = {0};
    while (!g_stop) {
        uint64_t r = rnd(&s);
        int k = (int)(r % 16);
        drop(mine[k]);
        mine[k] = obj(r >> 8);
        if ((r & 15) == 3)
            drop(__atomic_exchange_n(&g_pool[(r >> 30) % 256], obj(r >> 12), __ATOMIC_ACQ_REL));
        if ((r & 255) == 5) {
            void *q = rtk_api_malloc(40);
            memset(q, 9, 40);
            q = rtk_api_realloc(q, (r >> 9) & 1 ? 200 << 10 : 20);
            CHECK(q && ((unsigned char *)q)[19] == 9);
            rtk_api_free(q);
        }
    }
    for (int k = 0; k < 16; k++)
        drop(mine[k]);
    return NULL;
}

int main(void)
{
    pthread_t th[THREADS];
    for (int round = 0; round < 3; round++) {
        g_stop = 0;
        for (int t = 0; t < THREADS; t++)
            pthread_create(&th[t], NULL, worker, (void *)(uintptr_t)(round * 100 + t));
        for (int step = 0; step < 15; step++) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
            rtkit_step_mark();
        }
        g_stop = 1;
        for (int t = 0; t < THREADS; t++)
            pthread_join(th[t], NULL);
    }
    for (int i = 0; i < 256; i++)
        drop(g_pool[i]);
    printf("state %d\n", rtkit_malloc_state());
    if (g_failures) {
        fprintf(stderr, "prmalloc_unit_stress: %d check(s) failed\n", g_failures);
        return 1;
    }
    printf("prmalloc_unit_stress: ok\n");
    return 0;
}
