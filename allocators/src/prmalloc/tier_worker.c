/* tier_worker.c -- the heat budget's worker thread: the step marks signal it, it runs the passes beside the steps. */
#define _GNU_SOURCE
#include <stdint.h>

#include "prmalloc/tier.h"
#include "prmalloc/tier_internal.h"
#include "rtkit/prmalloc.h"

#define EXPORT __attribute__((visibility("default")))
#define LD(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)
#define WORKER_STACK ((size_t)256 << 10)

/* A pass writes back and drops up to gigabytes a run and waits for the disk: in a step mark it is the step's time
 * (0.5-0.7 s a step measured). One thread of the library's own runs them instead, started at the first step mark
 * that arms the heat (never before main, never inside dlsym or malloc), stopped at exit before the pool's file goes.
 * A mark records its step and wakes it; marks due while a pass runs are served by one pass after it, for the latest
 * step (a slow disk costs passes, never a queue). The worker blocks every signal and allocates nothing. */
static uint32_t g_asked;                  /* passes asked for (the marks', a futex word the worker sleeps on) */
static uint32_t g_served;                 /* passes served: the worker wakes waiters on it */
static uint64_t g_step;                   /* the step count of the latest mark that asked */
static unsigned long g_thread;
static int g_started;                     /* 1 while the worker runs in this process (0 in a forked child) */

static void *worker_main(void *arg)
{
    (void)arg;
    rtk_spin_lock(&rtk_tier.pass_lock);
    while (!rtk_tier_pass_point(0)) {
        uint32_t asked = LD(g_asked), served = g_served;
        if (asked != served) {
            rtk_tier_view.heat_merged += (uint32_t)(asked - served - 1);
            rtk_tier_heat_pass(LD(g_step));
            ST(g_served, asked);
            rtk_os_futex_wake(&g_served);
            continue;
        }
        /* idle: the pass lock free for a fork, asleep until the next mark or the exit */
        rtk_spin_unlock(&rtk_tier.pass_lock);
        rtk_os_futex_wait(&g_asked, asked);
        rtk_spin_lock(&rtk_tier.pass_lock);
    }
    ST(g_served, LD(g_asked));
    rtk_os_futex_wake(&g_served);
    rtk_spin_unlock(&rtk_tier.pass_lock);
    return NULL;
}

static void worker_start(void)
{
    if (rtk_tier_view.heat_worker)
        return;
    if (!rtk_setting_on(RTK_OPT_TIER_HEAT_WORKER)) {
        rtk_tier_view.heat_worker = -1;  /* tier_heat_worker=0: the marks run the passes */
        return;
    }
    int rc = rtk_os_thread_start(worker_main, NULL, WORKER_STACK, &g_thread);
    g_started = rc == 0;
    rtk_tier.pass_stop = 0;
    rtk_tier_view.heat_worker = rc == 0 ? 1 : -1;  /* -1: the marks run the passes themselves, as before */
}

void rtk_tier_heat_mark(void)
{
    int due = rtk_tier_heat_due();
    if (!due)
        return;
    double t0 = rtk_tier_now_s();
    if (due == 1) {
        rtk_spin_lock(&rtk_tier.live_lock);
        rtk_tier_heat_arm();
        rtk_spin_unlock(&rtk_tier.live_lock);
        if (rtk_tier_heat_on())
            worker_start();
    } else if (g_started) {
        ST(g_step, rtk_tier.steps);
        __atomic_add_fetch(&g_asked, 1, __ATOMIC_ACQ_REL);
        rtk_os_futex_wake(&g_asked);
    } else {
        rtk_spin_lock(&rtk_tier.pass_lock);
        rtk_tier_heat_pass(rtk_tier.steps);
        rtk_spin_unlock(&rtk_tier.pass_lock);
    }
    rtk_tier_view.heat_mark_s += rtk_tier_now_s() - t0;
}

/* ---------------------------------------------------------------- fork and exit
 * Before fork (the first prepare handler, before any other lock of the library): the worker (or a mark's own pass)
 * stops at its next pass point, holding no lock, and the pass lock is taken, so the child never sees a pass half way
 * through a record. Not where the forking thread holds the live lock or the pass lock itself (a signal handler's
 * fork inside a free or a pass): the pass may be waiting for that lock, and the child never runs a pass anyway. */
static int g_paused;

void rtk_tier_worker_pause(void)
{
    void *self = rtk_thread_self();
    g_paused = rtk_tier_heat_on() && __atomic_load_n(&rtk_tier.live_lock.owner, __ATOMIC_RELAXED) != self &&
               __atomic_load_n(&rtk_tier.pass_lock.owner, __ATOMIC_RELAXED) != self;
    if (!g_paused)
        return;
    ST(rtk_tier.pass_pause, 1);
    rtk_spin_lock(&rtk_tier.pass_lock);
}

void rtk_tier_worker_resume(void)
{
    if (!g_paused)
        return;
    g_paused = 0;
    rtk_spin_unlock(&rtk_tier.pass_lock);
    ST(rtk_tier.pass_pause, 0);
    rtk_os_futex_wake(&rtk_tier.pass_pause);
}

/* In the child only the forking thread exists: no worker, nothing to wait for, every word of it as new. The child
 * measures no heat (tier_heat.c), so no worker is started there. */
void rtk_tier_worker_forget(void)
{
    g_started = g_paused = 0;
    g_asked = g_served = 0;
    rtk_tier.pass_lock = (rtk_spin_t)RTK_SPIN_INIT;
    rtk_tier.pass_pause = rtk_tier.pass_hold = rtk_tier.pass_held = rtk_tier.pass_stop = 0;
    rtk_tier_view.heat_worker = 0;
}

/* At exit, before the stats are written and the pool's file unlinked: the pass in flight ends at its next pass point
 * (a test's hold too), a pass asked for is not run, and the worker is joined. */
void rtk_tier_worker_stop(void)
{
    if (!g_started)
        return;
    ST(rtk_tier.pass_stop, 1);
    ST(rtk_tier.pass_hold, 0);
    rtk_os_futex_wake(&rtk_tier.pass_hold);
    __atomic_add_fetch(&g_asked, 1, __ATOMIC_ACQ_REL);
    rtk_os_futex_wake(&g_asked);
    rtk_os_thread_join(g_thread);
    g_started = 0;
}

/* ---------------------------------------------------------------- for tests and tools reading a pass's effect */
EXPORT long rtkit_tier_heat_wait(void)
{
    if (!__atomic_load_n(&g_started, __ATOMIC_ACQUIRE))
        return -1;
    uint32_t target = LD(g_asked);
    for (uint32_t s; (int32_t)((s = LD(g_served)) - target) < 0 && !LD(rtk_tier.pass_stop);)
        rtk_os_futex_wait(&g_served, s);
    return (long)rtk_tier_view.heat_samples;
}

EXPORT int rtkit_tier_heat_hold(int on)
{
    if (!__atomic_load_n(&g_started, __ATOMIC_ACQUIRE))
        return -1;
    if (on) {
        ST(rtk_tier.pass_hold, 1);
        return (int)LD(rtk_tier.pass_held);
    }
    ST(rtk_tier.pass_hold, 0);
    rtk_os_futex_wake(&rtk_tier.pass_hold);
    return 0;
}
