/* census.c -- per-thread census slots: each thread counts into its own slot (initial-exec TLS pointer, no atomics
 * on the hot path); the step mark sums the slots. Slots are mmap'd and reused after thread exit. */
#include <pthread.h>
#include <string.h>

#include "common/os.h"
#include "prmalloc/internal.h"

__thread rtk_tslot_t *rtk_t_slot __attribute__((tls_model("initial-exec")));

static rtk_tslot_t *g_slots;         /* RTK_MAX_SLOTS slots, mmap'd (touched lazily) */
static int g_high;                   /* slots [0, g_high) have ever been used */
static rtk_spin_t g_slot_lock = RTK_SPIN_INIT;
static pthread_key_t g_key;
static int g_key_ok;
/* Shared sink for threads past their exit destructor and for slot exhaustion: its counts may lose an
 * increment under contention; exact counting there is not worth an atomic on every call. */
static rtk_tslot_t g_shared_slot __attribute__((aligned(64)));

static void slot_release(void *arg)
{
    rtk_tslot_t *s = arg;
    rtk_t_slot = &g_shared_slot;  /* later frees in this thread's other destructors still count */
    if (s && s != &g_shared_slot)
        __atomic_store_n(&s->owned, 0, __ATOMIC_RELEASE);
}

int rtk_census_init(void)
{
    g_slots = rtk_os_map(sizeof(rtk_tslot_t) * RTK_MAX_SLOTS, 0);
    /* pthread_key_create does not allocate; the destructor returns the slot at thread exit */
    g_key_ok = pthread_key_create(&g_key, slot_release) == 0;
    return g_slots ? 0 : -1;
}

rtk_tslot_t *rtk_slot_claim(void)
{
    rtk_tslot_t *s = &g_shared_slot;
    if (g_slots) {
        rtk_spin_lock(&g_slot_lock);
        for (int i = 0; i < RTK_MAX_SLOTS; i++) {
            if (i >= g_high || !__atomic_load_n(&g_slots[i].owned, __ATOMIC_ACQUIRE)) {
                /* counters are cumulative: a reused slot keeps the exited thread's counts */
                s = &g_slots[i];
                __atomic_store_n(&s->owned, 1, __ATOMIC_RELAXED);
                if (i >= g_high)
                    __atomic_store_n(&g_high, i + 1, __ATOMIC_RELEASE);
                break;
            }
        }
        rtk_spin_unlock(&g_slot_lock);
    }
    rtk_t_slot = s;  /* set before pthread_setspecific: it may allocate (keys >= 32) and re-enter us */
    if (s != &g_shared_slot && g_key_ok)
        pthread_setspecific(g_key, s);
    return s;
}

static void add_slot(rtk_totals_t *t, const rtk_tslot_t *s)
{
    for (int b = 0; b < RTK_BUCKETS; b++) {
        uint64_t c = __atomic_load_n(&s->count[b], __ATOMIC_RELAXED);
        t->count[b] += c;
        t->bucket_bytes[b] += __atomic_load_n(&s->bytes[b], __ATOMIC_RELAXED);
        t->allocs += c;
    }
    t->frees += __atomic_load_n(&s->frees, __ATOMIC_RELAXED);
    t->calloc_calls += __atomic_load_n(&s->calloc_calls, __ATOMIC_RELAXED);
    t->realloc_calls += __atomic_load_n(&s->realloc_calls, __ATOMIC_RELAXED);
    t->memalign_calls += __atomic_load_n(&s->memalign_calls, __ATOMIC_RELAXED);
    t->arena_hits += __atomic_load_n(&s->arena_hits, __ATOMIC_RELAXED);
    t->fallbacks += __atomic_load_n(&s->fallbacks, __ATOMIC_RELAXED);
    t->large_hits += __atomic_load_n(&s->large_hits, __ATOMIC_RELAXED);
    t->arena_misses += __atomic_load_n(&s->arena_misses, __ATOMIC_RELAXED);
    t->arena_exhausted += __atomic_load_n(&s->arena_exhausted, __ATOMIC_RELAXED);
    t->arena_above += __atomic_load_n(&s->arena_above, __ATOMIC_RELAXED);
    t->live += __atomic_load_n(&s->live, __ATOMIC_RELAXED);
}

void rtk_census_sum(rtk_totals_t *t)
{
    memset(t, 0, sizeof *t);
    int high = __atomic_load_n(&g_high, __ATOMIC_ACQUIRE);
    for (int i = 0; g_slots && i < high; i++)
        add_slot(t, &g_slots[i]);
    add_slot(t, &g_shared_slot);
    for (int b = 0; b < RTK_BUCKETS; b++)
        t->bytes += t->bucket_bytes[b];
    uint64_t large = t->arena_hits + t->fallbacks;
    t->small_calls = t->allocs > large ? t->allocs - large : 0;
    if (t->live < 0)
        t->live = 0;  /* the slots miss small frees: step.c takes rtk_live_bytes() (glibc's books + rtkit's) */
}

void rtk_census_fork_prepare(void) { rtk_spin_fork_prepare(&g_slot_lock); }
void rtk_census_fork_parent(void) { rtk_spin_fork_parent(&g_slot_lock); }

/* Only the forking thread survives in the child: every other slot is free again. */
void rtk_census_fork_child(void)
{
    rtk_spin_fork_child(&g_slot_lock);
    int high = g_high;
    for (int i = 0; g_slots && i < high; i++)
        if (&g_slots[i] != rtk_t_slot)
            g_slots[i].owned = 0;
}
