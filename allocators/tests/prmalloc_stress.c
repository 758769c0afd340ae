/* prmalloc_stress.c -- multithreaded stress under LD_PRELOAD: many threads, objects freed by other threads,
 * thread create/exit churn, recurring large sizes with step marks so arenas serve part of the load.
 * Every object carries a pattern that is checked before it is freed. Usage: prmalloc_stress [seconds-ish rounds] */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "prmalloc_test.h"

#define THREADS 8
#define SLOTS 512
#define ITERS 20000

static void *volatile g_exchange[SLOTS];   /* objects handed between threads */
static int g_rounds = 6;

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* header: size and a check word, then the tail byte (objects >= 32 bytes so they do not overlap) */
static void *obj_new(uint64_t *seed)
{
    static const size_t large[] = {40 << 10, 64 << 10, 256 << 10, 1 << 20, 3 << 20};
    uint64_t r = rnd(seed);
    size_t n;
    void *p;
    switch (r % 16) {
    case 0: n = large[(r >> 8) % 5]; p = malloc(n); break;
    case 1: n = large[(r >> 8) % 5]; if (posix_memalign(&p, 64, n)) p = NULL; break;
    case 2: n = 32 + (r >> 8) % 200; p = calloc(1, n); break;
    case 3: n = 1 + (r >> 8) % 4000; p = aligned_alloc(32, (n + 31) & ~(size_t)31); n = (n + 31) & ~(size_t)31; break;
    default: n = 32 + (r >> 8) % 500; p = malloc(n); break;
    }
    if (!p)
        return NULL;
    CHECK(malloc_usable_size(p) >= n);
    ((size_t *)p)[0] = n;
    ((size_t *)p)[1] = n ^ (uintptr_t)p;
    ((unsigned char *)p)[n - 1] = (unsigned char)(n * 7);
    return p;
}

static void obj_free(void *p)
{
    if (!p)
        return;
    size_t n = ((size_t *)p)[0];
    CHECK(((size_t *)p)[1] == (n ^ (uintptr_t)p));
    CHECK(((unsigned char *)p)[n - 1] == (unsigned char)(n * 7));
    ((size_t *)p)[1] = 0;
    free(p);
}

static void *worker(void *arg)
{
    uint64_t seed = (uintptr_t)arg * 0x9E3779B97F4A7C15ull + 1;
    void *local[32] = {0};
    for (int i = 0; i < ITERS; i++) {
        uint64_t r = rnd(&seed);
        int k = (int)(r % 32);
        obj_free(local[k]);
        local[k] = obj_new(&seed);
        if (r % 3 == 0) {  /* swap with the shared pool: the object is freed by whichever thread takes it */
            void *mine = obj_new(&seed);
            void *theirs = __atomic_exchange_n(&g_exchange[(r >> 20) % SLOTS], mine, __ATOMIC_ACQ_REL);
            obj_free(theirs);
        }
        if (r % 97 == 0) {  /* realloc across the small/large boundary */
            size_t n = (r >> 12) % 2 ? 100 : (1 << 20);
            void *q = malloc(64);
            memset(q, 0x5A, 64);
            q = realloc(q, n);
            CHECK(q && ((unsigned char *)q)[63] == 0x5A);
            free(q);
        }
    }
    for (int k = 0; k < 32; k++)
        obj_free(local[k]);
    return NULL;
}

static void *short_lived(void *arg)
{
    uint64_t seed = (uintptr_t)arg + 77;
    for (int i = 0; i < 50; i++)
        obj_free(obj_new(&seed));
    void *keep = obj_new(&seed);  /* left for another thread to free */
    void *old = __atomic_exchange_n(&g_exchange[(uintptr_t)arg % SLOTS], keep, __ATOMIC_ACQ_REL);
    obj_free(old);
    return NULL;
}

int main(int argc, char **argv)
{
    test_bind();
    if (argc > 1)
        g_rounds = atoi(argv[1]);
    for (int round = 0; round < g_rounds; round++) {
        pthread_t th[THREADS];
        for (int t = 0; t < THREADS; t++)
            CHECK(pthread_create(&th[t], NULL, worker, (void *)(uintptr_t)(round * THREADS + t + 1)) == 0);
        /* churn: waves of short threads while the workers run */
        for (int w = 0; w < 10; w++) {
            pthread_t s[8];
            for (int t = 0; t < 8; t++)
                CHECK(pthread_create(&s[t], NULL, short_lived, (void *)(uintptr_t)(round * 1000 + w * 8 + t)) == 0);
            for (int t = 0; t < 8; t++)
                pthread_join(s[t], NULL);
        }
        for (int t = 0; t < THREADS; t++)
            pthread_join(th[t], NULL);
        t_mark();
    }
    for (int i = 0; i < SLOTS; i++)
        obj_free(g_exchange[i]);
    t_mark();
    fprintf(stderr, "state %d\n", t_state());
    return test_done("prmalloc_stress");
}
