/* prmalloc_unit_owner.c -- the owner lookup (prmalloc/owner.h) answers for a block the fallback stash keeps: free,
 * realloc and malloc_usable_size of it all ask rtk_owner_of, linked against the sources (-DRTK_NO_INTERPOSE). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prmalloc/alloc.h"
#include "prmalloc/init.h"
#include "prmalloc/owner.h"

void rtk_api_free(void *);
void *rtk_api_realloc(void *, size_t);
size_t rtk_api_malloc_usable_size(void *);

static int g_failures;
#define CHECK(cond) do { if (!(cond)) { fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
                                         g_failures++; } } while (0)

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* 1 when fn(p) ends the process with SIGABRT (the program's bug on rtkit's memory: one line, abort) */
static int aborts(void (*fn)(void *), void *p)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        fn(p);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static void do_free(void *p) { rtk_api_free(p); }
static void do_realloc(void *p) { rtk_api_realloc(p, 700 * KiB); }

int main(void)
{
    rtk_init();
    /* a plan with one 1 MiB class, the large heap off: frees of glibc blocks of 32 KiB..2 MiB are kept */
    static rtk_plan_t plan;
    plan.nclasses = 1;
    plan.cls[0].size = MiB;
    plan.cls[0].blocks = 1;
    plan.reserved = MiB;
    rtk_stash_enable(&plan, 32 * KiB);

    void *kept = __libc_malloc(600 * KiB), *other = __libc_malloc(600 * KiB);
    CHECK(rtk_owner_of(kept).kind == RTK_OWNER_GLIBC && rtk_owner_of(kept).state == RTK_BLOCK_LIVE);
    CHECK(rtk_stash_push(kept, rtk_chunk_bytes(kept)) == 1);  /* the program freed it; the stash keeps it */

    rtk_owner_t o = rtk_owner_of(kept);
    CHECK(o.kind == RTK_OWNER_STASH && o.state == RTK_BLOCK_FREE);
    CHECK(rtk_owner_of(other).kind == RTK_OWNER_GLIBC);
    CHECK(rtk_owner_of(NULL).kind == RTK_OWNER_GLIBC);            /* an empty slot is no match */
    CHECK(rtk_owner_of((char *)kept + 16).kind == RTK_OWNER_GLIBC);
    CHECK(rtk_api_malloc_usable_size(kept) == 0);                 /* freed: no usable bytes, as glibc says */
    CHECK(rtk_api_malloc_usable_size(other) >= 600 * KiB);
    CHECK(aborts(do_free, kept));                                 /* its second free */
    CHECK(aborts(do_realloc, kept));                              /* realloc of a freed block */
    CHECK(!aborts(do_free, other));

    /* handed out again by the next fallback that fits: glibc's block once more */
    CHECK(rtk_stash_pop(600 * KiB, 0) == kept);
    CHECK(rtk_owner_of(kept).kind == RTK_OWNER_GLIBC && rtk_api_malloc_usable_size(kept) >= 600 * KiB);
    CHECK(rtk_stash_push(kept, rtk_chunk_bytes(kept)) == 1);
    rtk_stash_disable();                                          /* emptied into glibc: no owner but glibc */
    CHECK(rtk_owner_of(kept).kind == RTK_OWNER_GLIBC);
    __libc_free(other);

    if (g_failures) {
        fprintf(stderr, "prmalloc_unit_owner: %d check(s) failed\n", g_failures);
        return 1;
    }
    printf("prmalloc_unit_owner: ok\n");
    return 0;
}
