/* stats_steps.c -- allocator-<pid>.steps.<0|1>.jsonl: each step's record appended once, so the stats file rewritten
 * every period stays small (the 2,000-step ring rewritten whole with it cost ~320 KB a write, 0.3+ MiB/s). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/os.h"
#include "prmalloc/stats.h"
#include "prmalloc/state.h"

#define STEPS_BUF ((size_t)64 << 10)  /* records are written in pieces of at most this (a record is < 200 bytes) */

/* Steps [c * RTK_RING_STEPS, (c + 1) * RTK_RING_STEPS) are chunk c, in file c % 2: a chunk's file is made fresh when
 * its first record is written, so the two files hold the latest 2,000 to 4,000 records and never grow beyond. */
static struct {
    long pid;             /* the process these belong to: a forked child starts its own files */
    uint32_t next;        /* the first step index not written yet */
    long long chunk;      /* the chunk whose file this process made, -1 none */
    uint64_t dev, ino;
} g_w = {0, 0, -1, 0, 0};
static char *g_sbuf;

static void chunk_path(char *path, size_t cap, const char *run_dir, long pid, long long chunk)
{
    snprintf(path, cap, "%s/allocator-%ld.steps.%d.jsonl", run_dir, pid, (int)(chunk % 2));
}

/* A chunk's file, made as every run file is (fresh under a private name, renamed over the target: a planted link is
 * never written through), with its header line. */
static int make_chunk(const char *path, long long chunk)
{
    char head[256];
    int n = snprintf(head, sizeof head, "{\"chunk\": %lld, \"fields\": [\"step\", \"allocs\", \"frees\", \"bytes_allocated\", "
                     "\"live_bytes\", \"arena_hits\", \"fallbacks\", \"minor_faults\"]}\n", chunk);
    if (rtk_os_write_file_atomic(path, head, (size_t)n) != 0 || rtk_os_file_id(path, &g_w.dev, &g_w.ino) != 0) {
        g_w.chunk = -1;
        return -1;
    }
    g_w.chunk = chunk;
    return 0;
}

/* Append to the chunk's file only if it is still the file this process made (rtk_os_append_file): a file put in its
 * place is never appended to; the chunk is then made afresh (its earlier records are lost, the file is not). */
static int append(const char *path, long long chunk, const char *buf, size_t len)
{
    if (g_w.chunk != chunk && make_chunk(path, chunk) != 0)
        return -1;
    uint64_t was = 0;
    long w = rtk_os_append_file(path, g_w.dev, g_w.ino, buf, len, &was);
    if (w < 0 && make_chunk(path, chunk) == 0)
        w = rtk_os_append_file(path, g_w.dev, g_w.ino, buf, len, &was);
    if (w < 0)
        return -1;
    /* the pages this append begins are what the kernel counts (the last page, partly written, is most likely dirty) */
    rtk_os_files_written_add((was + (uint64_t)w + 4095) / 4096 * 4096 - (was + 4095) / 4096 * 4096);
    return (size_t)w == len ? 0 : -1;
}

uint32_t rtk_stats_steps_written(void)
{
    return g_w.pid == (long)rtk_engine.pid ? g_w.next : 0;
}

void rtk_stats_steps_append(void)
{
    int saved = errno;
    if (g_w.pid != (long)rtk_engine.pid) {  /* first write of this process (a forked child has the parent's ring) */
        g_w.pid = (long)rtk_engine.pid;
        g_w.next = 0;
        g_w.chunk = -1;
    }
    uint32_t steps = rtk_engine.steps;
    if (steps - g_w.next > RTK_RING_STEPS)  /* more steps than the ring keeps since the last write: the oldest are gone */
        g_w.next = steps - RTK_RING_STEPS;
    if (g_w.next >= steps || (!g_sbuf && !(g_sbuf = rtk_os_map(STEPS_BUF, 0)))) {
        errno = saved;
        return;
    }
    char path[sizeof rtk_engine.cfg.run_dir + 64];
    size_t off = 0;
    long long chunk = (long long)(g_w.next / RTK_RING_STEPS);
    for (uint32_t i = g_w.next; i < steps; i++) {
        const rtk_step_t *e = &rtk_engine.ring[i % RTK_RING_STEPS];
        long long c = (long long)(i / RTK_RING_STEPS);
        if (c != chunk || off + 256 > STEPS_BUF) {  /* a chunk's end, or a full buffer: out with what is there */
            chunk_path(path, sizeof path, rtk_engine.cfg.run_dir, g_w.pid, chunk);
            if (append(path, chunk, g_sbuf, off) != 0) {
                errno = saved;
                return;  /* the records not written are tried again at the next write */
            }
            g_w.next = i;
            off = 0;
            chunk = c;
        }
        int n = snprintf(g_sbuf + off, STEPS_BUF - off, "[%llu, %llu, %llu, %llu, %lld, %llu, %llu, %llu]\n",
                         (unsigned long long)e->step, (unsigned long long)e->allocs, (unsigned long long)e->frees,
                         (unsigned long long)e->bytes, (long long)e->live, (unsigned long long)e->arena_hits,
                         (unsigned long long)e->fallbacks, (unsigned long long)e->minor_faults);
        off += (size_t)n;
    }
    chunk_path(path, sizeof path, rtk_engine.cfg.run_dir, g_w.pid, chunk);
    if (append(path, chunk, g_sbuf, off) == 0)
        g_w.next = steps;
    errno = saved;
}
