/* init.c -- PRMalloc's settings, lazy initialisation, fork and exit handling, and its public C API (rtkit/prmalloc.h):
 * the top of the library's call graph (it calls the step machine, the stash, the profiler, the arenas, the tier). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/options.h"
#include "common/os.h"
#include "common/say.h"
#include "prmalloc/arena_slots.h"
#include "prmalloc/glibc_heap.h"
#include "prmalloc/init.h"
#include "prmalloc/large.h"
#include "prmalloc/owner.h"
#include "prmalloc/profile.h"
#include "prmalloc/fallback_stash.h"
#include "prmalloc/step.h"
#include "prmalloc/tier.h"
#include "rtkit/prmalloc.h"

#define EXPORT __attribute__((visibility("default")))

static __thread int t_in_init __attribute__((tls_model("initial-exec")));

/* Every setting of the library, its tier and its pool, read once; a bad value falls back to the table's default
 * (its message is kept for the stats files and said once per run). Only a bad RTKIT_MALLOC itself leaves the
 * allocator a plain pass-through. Returns 1 in that case. */
static int read_settings(void)
{
    rtk_opt_set_fallback_note(RTK_OPT_MALLOC, "the allocator runs as a plain pass-through");
    rtk_opt_load(RTK_PART_ALL);
    const char *dir = rtk_opt_internal(RTK_ENV_RUN_DIR);
    if (dir)
        snprintf(rtk_engine.cfg.run_dir, sizeof rtk_engine.cfg.run_dir, "%s", dir);
    return rtk_opt_bad(RTK_OPT_MALLOC);
}

static void fork_prepare(void);
static void fork_parent(void);
static void fork_child(void);

static void do_init(void)
{
    /* The first preloaded process of a tree marks itself in the environment its children inherit: only it
     * reports a bad setting on stderr and writes a stats file without step marks (helpers such as `uname`
     * spawned by the job stay silent). setenv may allocate: re-entry goes to glibc while t_in_init is set. */
    rtk_engine.pid = (pid_t)rtk_os_pid();
    rtk_engine.large_min = SIZE_MAX;
    const char *root = rtk_opt_internal(RTK_ENV_MALLOC_ROOT);
    rtk_engine.is_root = !root || atol(root) == (long)rtk_engine.pid;
    if (!root) {
        char b[32];
        snprintf(b, sizeof b, "%ld", (long)rtk_engine.pid);
        setenv(RTK_ENV_MALLOC_ROOT, b, 1);
    }
    int malloc_bad = read_settings();
    rtk_tier_read_settings();
    /* shells (pyenv shims) do not pass our marker on: the run directory's marker file makes it once per run */
    if (rtk_engine.is_root)
        rtk_say_kept(0, rtk_engine.cfg.run_dir, ".settings-reported");
    rtk_engine.plan_source = "none";
    rtk_engine.profile_reason = "";
    /* until the allocator is on, every malloc is glibc's: a budget no request overdraws (in practice) */
    rtk_fastpath.sample_bytes = SIZE_MAX / 2;
    rtk_fastpath.fast_max = SIZE_MAX;
    if (!rtk_setting_on(RTK_OPT_MALLOC)) {
        rtk_engine.state = RTK_STATE_OFF;
        return;
    }
    if (malloc_bad) {
        rtk_engine.state = RTK_STATE_DISABLED;  /* RTKIT_MALLOC itself is bad: plain pass-through, the stats file says why */
        return;
    }
    if (rtk_census_init() != 0) {
        rtk_engine.state = RTK_STATE_DISABLED;
        return;
    }
    pthread_atfork(fork_prepare, fork_parent, fork_child);  /* may allocate: re-entry goes to glibc */
    rtk_engine.state = RTK_STATE_PASSTHROUGH;
    rtk_engine.faults_mark = rtk_os_minor_faults();
    /* the large-object heap: address space only until used (its size bounds what it can ever hold) */
    rtk_large_set_debug(rtk_setting_on(RTK_OPT_MALLOC_DEBUG));
    if (rtk_setting_on(RTK_OPT_MALLOC_LARGE) && rtk_large_init(RTK_LARGE_LIMIT, 0) == 0) {
        rtk_publish_any();
        rtk_glibc_heap_setup(rtk_setting_on(RTK_OPT_MALLOC_THP));  /* the small objects left to glibc: huge pages for its thread heaps */
    }
    rtk_fastpath.inspect = 1;
    /* the inline small path assumes heap chunks: it stays under glibc's smallest mmap threshold (128 KiB) and
     * never reaches the tier; without the census, requests below min_size are a plain tail call to glibc */
    rtk_step_apply_min_size_setting();
    if (rtk_step_plan_at_init())
        return;
    if (rtk_engine.state == RTK_STATE_PASSTHROUGH && rtk_setting_num(RTK_OPT_MALLOC_PROFILE_START) == 0)
        rtk_step_start_profiling(0);
}

void rtk_init(void)
{
    int expect = RTK_MODE_UNINIT;
    if (__atomic_compare_exchange_n(&rtk_fastpath.mode, &expect, RTK_MODE_INITIALIZING, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        t_in_init = 1;
        do_init();
        t_in_init = 0;
        __atomic_store_n(&rtk_fastpath.mode, RTK_MODE_READY, __ATOMIC_RELEASE);
        return;
    }
    if (t_in_init)
        return;
    while (__atomic_load_n(&rtk_fastpath.mode, __ATOMIC_ACQUIRE) != RTK_MODE_READY)
        rtk_cpu_relax();
}

__attribute__((constructor)) static void rtk_ctor(void)
{
    if (rtk_fastpath.mode == RTK_MODE_UNINIT)
        rtk_init();
}

EXPORT void rtkit_step_mark(void)
{
    if (rtk_fastpath.mode != RTK_MODE_READY)
        rtk_init();
    rtk_tier_step_mark();
    if (rtk_fastpath.mode != RTK_MODE_READY || rtk_engine.state == RTK_STATE_OFF || rtk_engine.state == RTK_STATE_DISABLED) {
        if (rtk_engine.state == RTK_STATE_DISABLED)
            __atomic_add_fetch(&rtk_engine.steps, 1, __ATOMIC_RELAXED);
        return;
    }
    rtk_step_mark();
}

EXPORT int rtkit_malloc_state(void)
{
    if (rtk_fastpath.mode != RTK_MODE_READY)
        rtk_init();
    switch (rtk_engine.state) {
    case RTK_STATE_PROFILING: return 2;
    case RTK_STATE_PLANNED: return 3;
    case RTK_STATE_PASSTHROUGH: return 1;
    default: return 0;
    }
}

/* rtkit's own memory: a planned class's block (handed out or on its free stack) or a live large-heap block */
EXPORT int rtkit_malloc_in_arena(const void *p)
{
    rtk_owner_t o = rtk_owner_of(p);
    return o.kind == RTK_OWNER_ARENA || (o.kind == RTK_OWNER_LARGE && o.state == RTK_BLOCK_LIVE);
}

EXPORT int rtkit_malloc_in_pmem(const void *p)
{
    rtk_owner_t o = rtk_owner_of(p);
    return o.kind == RTK_OWNER_TIER && o.state == RTK_BLOCK_LIVE;
}

/* Where the tier pool's large records are (TF does not say where a variable's buffer is; the scheduler's lookahead
 * tells a table from its rows' values among the records of its size): pairs of (payload address, bytes) */
EXPORT size_t rtkit_malloc_pool_records(uint64_t (*out)[2], size_t max, uint64_t min_bytes)
{
    return out && max ? rtk_tier_records(out, max, min_bytes) : 0;
}

EXPORT int rtkit_malloc_write_stats(void)
{
    if (rtk_fastpath.mode != RTK_MODE_READY)
        rtk_init();
    if (rtk_engine.state == RTK_STATE_OFF || !rtk_engine.cfg.run_dir[0])
        return -1;
    return rtk_step_write_stats();
}

__attribute__((destructor)) static void rtk_dtor(void)
{
    rtk_tier_worker_stop();  /* its last pass ends before the stats are written and the pool's file goes */
    rtk_tier_pager_stop();
    if (rtk_fastpath.mode != RTK_MODE_READY || rtk_engine.state == RTK_STATE_OFF || !rtk_engine.cfg.run_dir[0])
        goto out;
    if (rtk_engine.steps == 0 && (rtk_engine.forked || !rtk_engine.is_root))
        goto out;  /* a helper process that never marked a step: the job's own file tells the story */
    rtkit_malloc_write_stats();
out:
    rtk_tier_exit();
}

/* glibc's stream list lock (libc.so.6 exports it). glibc's fork takes it only after the prepare handlers ran, yet a
 * thread in getdelim holds a FILE's lock while it reallocs (and may wait there for one of rtkit's locks) while
 * fflush(NULL) holds the list lock and waits for that FILE: rtkit's locks are taken inside the list lock, the
 * order glibc's own malloc keeps. It is recursive, so glibc's fork takes it again; a single-threaded process has no
 * other holder, so it is left alone there (a signal handler's fork may have interrupted its holder). */
extern void _IO_list_lock(void) __attribute__((weak));
extern void _IO_list_unlock(void) __attribute__((weak));
extern void _IO_list_resetlock(void) __attribute__((weak));
extern char __libc_single_threaded __attribute__((weak));
static int g_fork_io_locked;

static void fork_prepare(void)
{
    rtk_tier_worker_pause();  /* first: the worker's pass may still take any lock below */
    rtk_tier_pager_fork_prepare();
    g_fork_io_locked = _IO_list_lock && _IO_list_unlock && _IO_list_resetlock &&
                       !(&__libc_single_threaded && __libc_single_threaded);
    if (g_fork_io_locked)
        _IO_list_lock();
    rtk_step_fork_prepare();
    rtk_census_fork_prepare();
    rtk_profile_fork_prepare();
    rtk_stash_fork_prepare();
    rtk_arenas_fork_prepare();
    rtk_large_lock();
    rtk_publish_fork_prepare();
    rtk_tier_fork_prepare();
}

static void fork_parent(void)
{
    rtk_tier_fork_parent();
    rtk_publish_fork_parent();
    rtk_large_unlock();
    rtk_arenas_fork_parent();
    rtk_stash_fork_parent();
    rtk_profile_fork_parent();
    rtk_census_fork_parent();
    rtk_step_fork_parent();
    if (g_fork_io_locked)
        _IO_list_unlock();
    rtk_tier_pager_fork_parent();
    rtk_tier_worker_resume();
}

static void fork_child(void)
{
    rtk_tier_worker_forget();
    rtk_tier_pager_fork_child();
    rtk_publish_fork_child();
    rtk_large_reset_lock();
    rtk_arenas_fork_child();
    rtk_stash_fork_child();
    rtk_profile_fork_child();
    rtk_census_fork_child();
    rtk_step_fork_child();
    rtk_tier_fork_child();
    rtk_os_files_written_forget();
    if (g_fork_io_locked)
        _IO_list_resetlock();  /* glibc's fork resets it too when it took it: only this thread is left */
    rtk_engine.forked = 1;
    rtk_engine.pid = (pid_t)rtk_os_pid();
    rtk_engine.is_root = 0;
    rtk_engine.last_write_ns = 0;
}
