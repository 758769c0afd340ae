/* pool.c -- PMEM pool lifetime, the public calls: anonymous, create, open, sync, close (their parts: pool_setup.c;
 * recovery: recover.c; caches: cache.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include "pmem/cache.h"
#include "pmem/pool_setup.h"
#include "pmem/recover.h"

RTK_EXPORT int rtkit_pmem_anonymous(uint64_t size, const rtkit_pmem_options *opts, rtkit_pmem_pool **out) {
    rtkit_pmem_options d;
    if (!opts) rtkit_pmem_options_init(&d), opts = &d;
    if (!out) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, "<anonymous>", "out pointer is NULL");
    *out = NULL;
    struct rtk_geom g;
    int grc = rtk_pool_geometry(opts, size, "<anonymous>", &g);
    if (grc) return grc;
    g.uuid = rtk_pool_new_uuid();
    struct rtkit_pmem_pool *p = rtk_pool_new(&g, NULL);
    if (!p) return rtk_fail(RTKIT_PMEM_ESYS, ENOMEM, "<anonymous>", "out of memory for pool tables");
    void *a = rtk_os_reserve(size, 0);
    if (!a) {
        int e = errno;
        rtk_pool_release(p);  /* nothing mapped or open yet */
        return rtk_fail(RTKIT_PMEM_ESYS, e, "<anonymous>", "cannot map %llu bytes: %s", (unsigned long long)size,
                        strerror(e));
    }
    p->base = a;
    p->anonymous = 1;
    p->pkind = RTKIT_PMEM_PERSIST_NONE;
    rtk_pool_init_header(p);
    int rc = rtk_pool_finish_open(p, opts);
    if (rc) {
        rtk_pool_abort_open(p);
        return rc;
    }
    *out = p;
    return 0;
}

RTK_EXPORT int rtkit_pmem_create(const char *path, uint64_t size, const rtkit_pmem_options *opts,
                                 rtkit_pmem_pool **out) {
    rtkit_pmem_options d;
    if (!opts) rtkit_pmem_options_init(&d), opts = &d;
    if (!path || !*path || !out) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, path, "path and out are required");
    *out = NULL;
    struct rtk_geom g;
    int grc = rtk_pool_geometry(opts, size, path, &g);
    if (grc) return grc;
    /* O_EXCL: a pool is only ever a new file (never through a planted link); 0666 leaves the mode to the umask */
    int fd = rtk_os_create_excl(path);
    if (fd < 0) {
        int e = -fd;
        if (e == EEXIST) return rtk_fail(RTKIT_PMEM_EEXIST, e, path, "file exists; open it or remove it first");
        return rtk_fail(RTKIT_PMEM_ESYS, e, path, "cannot create the pool file: %s", strerror(e));
    }
    rtk_os_lock(fd, 1);
    int e = -rtk_os_allocate(fd, size);
    if (e) {
        rtk_os_close(fd);
        rtk_os_unlink(path);
        if (e == ENOSPC || e == EFBIG)
            return rtk_fail(RTKIT_PMEM_ENOSPC, e, path, "no space for a pool of %llu bytes: %s",
                            (unsigned long long)size, strerror(e));
        return rtk_fail(RTKIT_PMEM_ESYS, e, path, "cannot size the pool file: %s", strerror(e));
    }
    g.uuid = rtk_pool_new_uuid();
    struct rtkit_pmem_pool *p = rtk_pool_new(&g, path);
    if (!p) {
        rtk_os_close(fd);
        rtk_os_unlink(path);
        return rtk_fail(RTKIT_PMEM_ESYS, ENOMEM, path, "out of memory for pool tables");
    }
    p->fd = fd;
    int rc = rtk_pool_map_file(p, path, opts->force_msync);
    if (rc) {
        rtk_pool_abort_open(p);
        rtk_os_unlink(path);
        return rc;
    }
    /* the file is all zeros (a free segment table); the header goes last, so a crash during create
     * leaves a file that is not a pool rather than a broken pool */
    rtk_pool_init_header(p);
    struct rtk_hdr *h = (struct rtk_hdr *)p->base;
    char magic[8];
    memcpy(magic, h->magic, 8);
    memset(h->magic, 0, 8);
    rtk_persist(p, p->base, g.data_off);
    memcpy(h->magic, magic, 8);
    rtk_persist(p, h, sizeof *h);
    rc = rtk_pool_finish_open(p, opts);
    if (rc) {
        rtk_pool_abort_open(p);
        rtk_os_unlink(path);
        return rc;
    }
    rtk_pool_note_open(p, 1);
    *out = p;
    return 0;
}

RTK_EXPORT int rtkit_pmem_open(const char *path, const rtkit_pmem_options *opts, rtkit_pmem_pool **out) {
    rtkit_pmem_options d;
    if (!opts) rtkit_pmem_options_init(&d), opts = &d;
    if (!path || !*path || !out) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, path, "path and out are required");
    *out = NULL;
    int fd = rtk_os_open_nonblock(path, 1); /* a FIFO or device never blocks: refused below */
    if (fd < 0) return rtk_fail(RTKIT_PMEM_ESYS, -fd, path, "cannot open the pool: %s", strerror(-fd));
    int e = -rtk_os_lock(fd, 1);
    if (e) {
        if (e == EWOULDBLOCK) {
            int here = rtk_pool_open_here(fd);
            rtk_os_close(fd);
            return rtk_fail(RTKIT_PMEM_EBUSY, EBUSY, path, here ? "pool is already open in this process (close it first)"
                                                             : "pool is open in another process");
        }
        rtk_os_close(fd);
        return rtk_fail(RTKIT_PMEM_ESYS, e, path, "cannot lock the pool: %s", strerror(e));
    }
    struct rtk_hdr h;
    struct rtk_geom g;
    int rc = rtk_read_header(fd, path, &h, &g);
    if (!rc && ((opts->segment_size && opts->segment_size != g.seg_size) ||
                (opts->block_size && opts->block_size != g.block) ||
                (opts->max_record && opts->max_record != g.max_record) ||
                (opts->expect_size && opts->expect_size != g.size)))
        rc = rtk_fail(RTKIT_PMEM_EGEOMETRY, EINVAL, path,
                      "pool has size %llu, segment %llu, block %u, max record %u; asked for size %llu, segment %llu, "
                      "block %u, max record %u (0 = any)",
                      (unsigned long long)g.size, (unsigned long long)g.seg_size, g.block, g.max_record,
                      (unsigned long long)opts->expect_size, (unsigned long long)opts->segment_size, opts->block_size,
                      opts->max_record);
    if (rc) {
        rtk_os_close(fd);
        return rc;
    }
    struct rtkit_pmem_pool *p = rtk_pool_new(&g, path);
    if (!p) {
        rtk_os_close(fd);
        return rtk_fail(RTKIT_PMEM_ESYS, ENOMEM, path, "out of memory for pool tables");
    }
    p->fd = fd;
    p->was_clean = h.clean && h.mcsum == rtk_hdr_mcsum(&h);
    rc = rtk_pool_map_file(p, path, opts->force_msync);
    if (!rc) rc = rtk_pool_finish_open(p, opts);
    if (rc) {
        rtk_pool_abort_open(p);
        return rc;
    }
    rtk_pool_note_open(p, 1);
    *out = p;
    return 0;
}

RTK_EXPORT int rtkit_pmem_sync(rtkit_pmem_pool *p) {
    if (!p) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, NULL, "pool is NULL");
    if (p->pkind == RTKIT_PMEM_PERSIST_MSYNC) {
        int e = rtk_os_sync_range(p->base, p->g.size);
        if (e) return rtk_fail(RTKIT_PMEM_ESYS, -e, p->path, "msync failed: %s", strerror(-e));
    } else {
        rtk_persist(p, p->base, p->g.size);
    }
    return 0;
}

RTK_EXPORT int rtkit_pmem_close(rtkit_pmem_pool *p) {
    if (!p) return 0;
    if (p->bg_running) {
        pthread_mutex_lock(&p->bg_mu);
        p->bg_stop = 1;
        pthread_cond_signal(&p->bg_cv);
        pthread_mutex_unlock(&p->bg_mu);
        pthread_join(p->bg, NULL);
    }
    rtk_release_all_tcaches(p);
    pthread_key_delete(p->key);
    int rc = 0;
    if (!p->anonymous) {
        /* a clean close makes everything durable: payloads never persisted, and in volatile mode the headers */
        rtk_write_summaries(p);  /* before the sync and the clean flag: current whenever the flag is set */
        if (p->pkind != RTKIT_PMEM_PERSIST_NONE) rc = rtkit_pmem_sync(p);
        rtk_write_mutable(p, 1);
    }
    if (p->file_ino) rtk_pool_note_open(p, 0);
    rtk_pool_release(p);
    return rc;
}
