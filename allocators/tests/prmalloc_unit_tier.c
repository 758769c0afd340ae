/* prmalloc_unit_tier.c -- two threads freeing one tier block at once: exactly one gives the record back, the other is
 * told it lost (a double free); linked against the sources (-DRTK_NO_INTERPOSE). RTKIT_TIER_POOL_PATH set by the caller. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>

#include "prmalloc/init.h"
#include "prmalloc/owner.h"
#include "prmalloc/tier_internal.h"

void rtk_api_free(void *);
size_t rtk_api_malloc_usable_size(void *);

static int g_failures;
#define CHECK(cond) do { if (!(cond)) { fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
                                         g_failures++; } } while (0)

#define MiB ((size_t)1 << 20)
#define RACES 200

/* Two frees of one payload that both passed the lock-free owner lookup: what free() does when two threads free the
 * same block at once. The barrier lines them up; whichever runs first, exactly one may give the record back. */
static struct { void *p; rtk_owner_t o; pthread_barrier_t go; int rc[2]; } race;

static void *racer(void *arg)
{
    int me = (int)(intptr_t)arg;
    pthread_barrier_wait(&race.go);
    race.rc[me] = rtk_tier_free(race.p, race.o.size, race.o.tier_handle);
    pthread_barrier_wait(&race.go);
    return NULL;
}

int main(void)
{
    rtk_init();
    void *p = rtk_tier_alloc(MiB, 0, 0, 0);
    CHECK(p != NULL);
    if (!p) {
        fprintf(stderr, "prmalloc_unit_tier: tier mode did not place a block (RTKIT_TIER_POOL_PATH unset?)\n");
        return 1;
    }
    rtk_owner_t o = rtk_owner_of(p);
    CHECK(o.kind == RTK_OWNER_TIER && o.state == RTK_BLOCK_LIVE && o.size == MiB);
    CHECK(rtk_owner_of((char *)p + 16).state == RTK_BLOCK_NONE);  /* no payload starts there */
    rtk_api_free(p);
    o = rtk_owner_of(p);
    CHECK(o.kind == RTK_OWNER_TIER && o.state == RTK_BLOCK_FREE && rtk_api_malloc_usable_size(p) == 0);

    uint64_t frees = rtk_tier.frees, bad = rtk_tier.bad_frees, bytes = rtk_tier.bytes;
    int both = 0, none = 0;
    pthread_barrier_init(&race.go, NULL, 3);
    for (int i = 0; i < RACES; i++) {
        race.p = rtk_tier_alloc(MiB, 0, 0, 0);
        CHECK(race.p != NULL);
        if (!race.p)
            break;
        race.o = rtk_owner_of(race.p);
        race.rc[0] = race.rc[1] = 1;
        pthread_t t[2];
        for (int k = 0; k < 2; k++)
            pthread_create(&t[k], NULL, racer, (void *)(intptr_t)k);
        pthread_barrier_wait(&race.go);
        pthread_barrier_wait(&race.go);
        for (int k = 0; k < 2; k++)
            pthread_join(t[k], NULL);
        int won = (race.rc[0] == 0) + (race.rc[1] == 0), lost = (race.rc[0] == -2) + (race.rc[1] == -2);
        both += won == 2;
        none += won == 0;
        CHECK(won == 1 && lost == 1);
    }
    pthread_barrier_destroy(&race.go);
    fprintf(stderr, "races: %d, both won %d, none won %d\n", RACES, both, none);
    /* every record given back once: the pool's books balance */
    CHECK(rtk_tier.frees - frees == RACES && rtk_tier.bad_frees - bad == RACES && rtk_tier.bytes == bytes);

    if (g_failures) {
        fprintf(stderr, "prmalloc_unit_tier: %d check(s) failed\n", g_failures);
        return 1;
    }
    printf("prmalloc_unit_tier: ok\n");
    return 0;
}
