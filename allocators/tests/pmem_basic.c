/* pmem_basic.c -- PMEM pool unit tests: create/open, errors, geometry, corruption, exhaustion, extents, iteration. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "rtkit/pmem.h"

static int failures;
#define CHECK(cond, ...)                                                              \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);           \
            fprintf(stderr, __VA_ARGS__);                                             \
            fprintf(stderr, " (last error: %s)\n", rtkit_pmem_last_error());          \
            failures++;                                                               \
        }                                                                             \
    } while (0)

static char dir[256];
static char *pathf(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

static rtkit_pmem_options small_opts(void) {
    rtkit_pmem_options o;
    rtkit_pmem_options_init(&o);
    o.segment_size = 64 * 1024;
    o.rebalance_ms = -1;
    return o;
}

static void test_errors(void) {
    rtkit_pmem_pool *p = NULL;
    rtkit_pmem_options o = small_opts();
    int rc = rtkit_pmem_create("/nonexistent-dir-rtkit/x.pool", 1 << 20, &o, &p);
    CHECK(rc == RTKIT_PMEM_ESYS && errno == ENOENT && !p, "missing dir rc=%d", rc);
    CHECK(strstr(rtkit_pmem_last_error(), "/nonexistent-dir-rtkit/x.pool") != NULL, "path in message");
    rc = rtkit_pmem_create(pathf("tiny.pool"), 32 * 1024, &o, &p);
    CHECK(rc == RTKIT_PMEM_EINVAL && access(pathf("tiny.pool"), F_OK) != 0, "size below a segment rc=%d", rc);
    rtkit_pmem_options bad = o;
    bad.block_size = 48;
    rc = rtkit_pmem_create(pathf("bad.pool"), 1 << 20, &bad, &p);
    CHECK(rc == RTKIT_PMEM_EINVAL, "block 48 rc=%d", rc);
    /* not a pool: contents must stay */
    int fd = open(pathf("notpool"), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    char junk[8192];
    memset(junk, 'x', sizeof junk);
    CHECK(write(fd, junk, sizeof junk) == (ssize_t)sizeof junk, "write");
    close(fd);
    rc = rtkit_pmem_open(pathf("notpool"), &o, &p);
    CHECK(rc == RTKIT_PMEM_ENOTPOOL, "not a pool rc=%d", rc);
    fd = open(pathf("notpool"), O_RDONLY);
    char back[8192];
    CHECK(read(fd, back, sizeof back) == (ssize_t)sizeof back && !memcmp(back, junk, sizeof junk), "untouched");
    close(fd);
    rc = rtkit_pmem_create(pathf("notpool"), 1 << 20, &o, &p);
    CHECK(rc == RTKIT_PMEM_EEXIST, "create over existing rc=%d", rc);
}

static void test_roundtrip_and_geometry(void) {
    rtkit_pmem_pool *p = NULL;
    rtkit_pmem_options o = small_opts();
    const char *path = pathf("rt.pool");
    int rc = rtkit_pmem_create(path, 16 << 20, &o, &p);
    CHECK(rc == 0, "create rc=%d", rc);
    if (rc) return;
    uint64_t h[100];
    for (int i = 0; i < 100; i++) {
        rc = rtkit_pmem_alloc(p, 8 + i * 40, &h[i]);
        CHECK(rc == 0, "alloc %d", i);
        memset(rtkit_pmem_ptr(p, h[i]), i, 8 + i * 40);
        rtkit_pmem_persist(p, h[i], 0, 0);
    }
    uint64_t big;
    CHECK(rtkit_pmem_alloc(p, 200 * 1024, &big) == 0, "extent");
    memset(rtkit_pmem_ptr(p, big), 0xAB, 200 * 1024);
    uint64_t huge;
    rc = rtkit_pmem_alloc(p, 64ull << 20, &huge);
    CHECK(rc == RTKIT_PMEM_ETOOBIG, "above max extent rc=%d", rc);
    for (int i = 0; i < 100; i += 2) CHECK(rtkit_pmem_free(p, h[i]) == 0, "free %d", i);
    rc = rtkit_pmem_free(p, h[0]);
    CHECK(rc == RTKIT_PMEM_EDOUBLEFREE, "double free rc=%d", rc);
    rc = rtkit_pmem_free(p, h[1] + 8);
    CHECK(rc == RTKIT_PMEM_EBADHANDLE, "bad handle rc=%d", rc);
    rtkit_pmem_pool *q = NULL;
    rc = rtkit_pmem_open(path, &o, &q);
    CHECK(rc == RTKIT_PMEM_EBUSY, "second open rc=%d", rc);
    CHECK(rtkit_pmem_close(p) == 0, "close");

    rtkit_pmem_options wrong = o;
    wrong.segment_size = 128 * 1024;
    rc = rtkit_pmem_open(path, &wrong, &q);
    CHECK(rc == RTKIT_PMEM_EGEOMETRY, "wrong geometry rc=%d", rc);
    wrong = o;
    wrong.block_size = 128;
    rc = rtkit_pmem_open(path, &wrong, &q);
    CHECK(rc == RTKIT_PMEM_EGEOMETRY, "wrong block rc=%d", rc);

    rc = rtkit_pmem_open(path, &o, &q);
    CHECK(rc == 0, "reopen rc=%d", rc);
    if (rc) return;
    int n = 0;
    uint64_t cur = 0, req;
    for (;;) {
        CHECK(rtkit_pmem_next(q, cur, &cur, &req) == 0, "next");
        if (!cur) break;
        n++;
    }
    CHECK(n == 51, "live after reopen %d", n);
    for (int i = 1; i < 100; i += 2) {
        uint64_t r, u;
        CHECK(rtkit_pmem_record_size(q, h[i], &r, &u) == 0 && r == (uint64_t)(8 + i * 40), "size %d", i);
        unsigned char *b = rtkit_pmem_ptr(q, h[i]);
        int ok = 1;
        for (int k = 0; k < 8 + i * 40; k++) ok &= b[k] == i;
        CHECK(ok, "contents %d", i);
    }
    for (int i = 0; i < 100; i += 2) CHECK(rtkit_pmem_record_size(q, h[i], NULL, NULL) != 0, "freed %d", i);
    CHECK(((unsigned char *)rtkit_pmem_ptr(q, big))[200 * 1024 - 1] == 0xAB, "extent contents");
    CHECK(rtkit_pmem_free(q, big) == 0, "free extent");
    rtkit_pmem_stats st;
    rtkit_pmem_stats_get(q, &st);
    CHECK(st.allocated_records == 50 && st.recovered_records == 51, "stats %llu %llu",
          (unsigned long long)st.allocated_records, (unsigned long long)st.recovered_records);
    CHECK(rtkit_pmem_close(q) == 0, "close 2");

    rtkit_pmem_check_report rep;
    rc = rtkit_pmem_check(path, &rep);
    CHECK(rc == 0 && rep.records_allocated == 50 && rep.clean == 1, "check rc=%d alloc=%llu", rc,
          (unsigned long long)rep.records_allocated);

    /* header corruption: check reports it, open refuses */
    int fd = open(path, O_RDWR);
    char byte;
    CHECK(pread(fd, &byte, 1, 20) == 1, "read");
    byte ^= 0x40;
    CHECK(pwrite(fd, &byte, 1, 20) == 1, "write");
    rc = rtkit_pmem_check(path, &rep);
    CHECK(rc == RTKIT_PMEM_ECORRUPT && rep.errors > 0, "corrupt header check rc=%d", rc);
    rc = rtkit_pmem_open(path, &o, &q);
    CHECK(rc == RTKIT_PMEM_ECORRUPT, "corrupt header open rc=%d", rc);
    byte ^= 0x40;
    CHECK(pwrite(fd, &byte, 1, 20) == 1, "restore");
    /* segment table corruption */
    uint64_t ent;
    CHECK(pread(fd, &ent, 8, 4096) == 8, "read entry");
    ent ^= 1ull << 30;
    CHECK(pwrite(fd, &ent, 8, 4096) == 8, "write entry");
    rc = rtkit_pmem_check(path, &rep);
    CHECK(rc == RTKIT_PMEM_ECORRUPT, "corrupt table check rc=%d", rc);
    ent ^= 1ull << 30;
    CHECK(pwrite(fd, &ent, 8, 4096) == 8, "restore entry");
    close(fd);
    rc = rtkit_pmem_check(path, &rep);
    CHECK(rc == 0, "restored check rc=%d", rc);
}

static void test_exhaustion(int durable) {
    rtkit_pmem_pool *p = NULL;
    rtkit_pmem_options o = small_opts();
    o.durable = durable;
    const char *path = pathf(durable ? "full-d.pool" : "full-v.pool");
    int rc = rtkit_pmem_create(path, 2 << 20, &o, &p);
    CHECK(rc == 0, "create rc=%d", rc);
    if (rc) return;
    static uint64_t hs[200000];
    int n = 0;
    while (n < 200000 && rtkit_pmem_alloc(p, 100 + (n % 7) * 100, &hs[n]) == 0) {
        *(uint64_t *)rtkit_pmem_ptr(p, hs[n]) = hs[n] * 3;
        n++;
    }
    CHECK(n > 1000 && n < 200000, "filled %d", n);
    CHECK(errno == ENOSPC, "errno at full %d", errno);
    /* larger-class fallback: free small ones, then a small alloc must succeed without new segments */
    for (int i = 0; i < n; i += 3) rtkit_pmem_free(p, hs[i]), hs[i] = 0;
    uint64_t x;
    CHECK(rtkit_pmem_alloc(p, 30, &x) == 0, "small alloc after free on a full pool");
    rtkit_pmem_free(p, x);
    rtkit_pmem_close(p);
    rc = rtkit_pmem_open(path, &o, &p);
    CHECK(rc == 0, "reopen full rc=%d", rc);
    if (rc) return;
    int bad = 0, live = 0;
    for (int i = 0; i < n; i++) {
        if (!hs[i]) continue;
        live++;
        bad += rtkit_pmem_record_size(p, hs[i], NULL, NULL) != 0 || *(uint64_t *)rtkit_pmem_ptr(p, hs[i]) != hs[i] * 3;
    }
    CHECK(bad == 0, "%d of %d records lost", bad, live);
    /* refill: nothing handed out twice */
    int again = 0, dup = 0;
    uint64_t h;
    while (rtkit_pmem_alloc(p, 100, &h) == 0) {
        again++;
        for (int i = 0; i < n && again < 5000; i++) dup += hs[i] == h;
    }
    CHECK(again > 0 && dup == 0, "refill %d dup %d", again, dup);
    rtkit_pmem_close(p);
}

static void test_anonymous(void) {
    rtkit_pmem_pool *p;
    rtkit_pmem_options o = small_opts();
    CHECK(rtkit_pmem_anonymous(8 << 20, &o, &p) == 0, "anonymous");
    uint64_t h;
    CHECK(rtkit_pmem_alloc(p, 4096, &h) == 0, "alloc");
    CHECK(rtkit_pmem_free(p, h) == 0, "free");
    rtkit_pmem_close(p);
}

/* Single-segment records taken between and after a table-sized one must not split the room it leaves: the next
 * table needs one run of segments (128 segments of 64 KiB; tables of 60 and 100 segments, records of one). */
static void test_small_records_leave_one_run(void) {
    rtkit_pmem_options o = small_opts();
    rtkit_pmem_pool *p = NULL;
    uint64_t seg = o.segment_size, x, y, z, a, b;
    int rc = rtkit_pmem_create(pathf("runs.pool"), 129 * seg, &o, &p); /* one segment holds the pool's own table */
    CHECK(rc == 0, "create rc=%d", rc);
    if (rc) return;
    rtkit_pmem_stats st;
    rtkit_pmem_stats_get(p, &st);
    uint64_t nseg = st.nsegments, one = seg / 2, big = 60 * seg - 4096;
    CHECK(rtkit_pmem_alloc(p, one, &x) == 0, "first small record");
    CHECK(rtkit_pmem_alloc(p, big, &a) == 0, "table of 60 segments");
    CHECK(rtkit_pmem_alloc(p, one, &y) == 0, "second small record");
    CHECK(rtkit_pmem_free(p, a) == 0, "table freed");
    CHECK(rtkit_pmem_alloc(p, one, &z) == 0, "third small record");
    /* every segment but the three small records' is free: a table of all but a few of them must fit */
    uint64_t want = (nseg - 3 - 2) * seg - 4096;
    rc = rtkit_pmem_alloc(p, want, &b);
    CHECK(rc == 0, "a table of %llu segments beside 3 small records in %llu: rc=%d (%s)",
          (unsigned long long)(nseg - 5), (unsigned long long)nseg, rc, rtkit_pmem_last_error());
    rtkit_pmem_close(p);
}

int main(int argc, char **argv) {
    const char *base = argc > 1 ? argv[1] : (access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    snprintf(dir, sizeof dir, "%s/rtkit-pmem-basic-%d", base, getpid());
    if (mkdir(dir, 0755)) return perror("mkdir"), 2;
    test_errors();
    test_roundtrip_and_geometry();
    test_exhaustion(1);
    test_exhaustion(0);
    test_anonymous();
    test_small_records_leave_one_run();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
    if (failures) fprintf(stderr, "pmem_basic: %d failures\n", failures);
    else fprintf(stderr, "pmem_basic: ok\n");
    return failures ? 1 : 0;
}
