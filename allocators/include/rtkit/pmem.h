/* pmem.h -- public C API of rtkit's PMEM segment allocator: persistent, recoverable pools of records. */
#ifndef RTKIT_PMEM_H
#define RTKIT_PMEM_H

/*
 * A pool is a file (or anonymous DRAM) cut into segments; each segment holds records of one class
 * (a whole number of blocks) or is part of a run of segments holding one large extent. Handles are
 * byte offsets of a record's payload from the start of the pool, so they stay valid across reopen.
 * Every call returns 0 or a negative RTKIT_PMEM_E* code, sets errno, and leaves a one-line message
 * (path + reason) in rtkit_pmem_last_error() for the calling thread. The pool's contents are never
 * changed by a call that fails.
 *
 * The code behind this header calls malloc nowhere (internal tables are mmap'ed), so the preload
 * allocator can link it statically.
 */
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RTKIT_PMEM_FORMAT_VERSION 3  /* 3: a per-segment summary of live records, written at a clean close */
#define RTKIT_PMEM_RECORD_HEADER 16 /* bytes of persistent header in front of every payload */

enum {
    RTKIT_PMEM_OK = 0,
    RTKIT_PMEM_EINVAL = -1,     /* bad argument (size below one segment, bad geometry, ...) */
    RTKIT_PMEM_ESYS = -2,       /* a system call failed: errno says which (missing directory, ...) */
    RTKIT_PMEM_ENOTPOOL = -3,   /* the file is not an rtkit pool */
    RTKIT_PMEM_EVERSION = -4,   /* the pool has another format version */
    RTKIT_PMEM_EGEOMETRY = -5,  /* the pool has other sizes than the caller asked for */
    RTKIT_PMEM_ECORRUPT = -6,   /* a checksum or structure check failed */
    RTKIT_PMEM_ENOSPC = -7,     /* the pool (or the file system) has no room */
    RTKIT_PMEM_ETOOBIG = -8,    /* allocation larger than the largest possible extent */
    RTKIT_PMEM_EDOUBLEFREE = -9,/* the record is already free */
    RTKIT_PMEM_EBADHANDLE = -10,/* not the handle of a record of this pool */
    RTKIT_PMEM_EBUSY = -11,     /* another process has the pool open */
    RTKIT_PMEM_EEXIST = -12,    /* create: the file exists already */
};

enum { RTKIT_PMEM_PERSIST_NONE = 0, RTKIT_PMEM_PERSIST_MSYNC = 1, RTKIT_PMEM_PERSIST_FLUSH = 2 };

typedef struct rtkit_pmem_pool rtkit_pmem_pool;

typedef struct rtkit_pmem_options {
    uint64_t segment_size;  /* create: 0 = RTKIT_PMEM_SEGMENT_SIZE or 1 MiB; open: 0 = any, else must match */
    uint32_t block_size;    /* same rule; default 64, a power of two >= 8 */
    uint32_t max_record;    /* same rule; largest payload served by record classes, default 4096 */
    uint64_t expect_size;   /* open: 0 = any, else the pool size must match */
    int durable;            /* -1 = RTKIT_PMEM_DURABLE or on; 1 = persist each header before returning; 0 = volatile */
    int rebalance_ms;       /* 0 = RTKIT_PMEM_REBALANCE_MS or 1000; < 0 = no background thread */
    int rebalance_min;      /* 0 = RTKIT_PMEM_REBALANCE_MIN or 8 */
    int recovery_threads;   /* 0 = online CPUs (at most 16) */
    int force_msync;        /* 1 = msync even where the medium cannot outlive the process (tmpfs) */
} rtkit_pmem_options;

typedef struct rtkit_pmem_stats {
    uint64_t pool_size, segment_size, data_offset;
    uint32_t block_size, max_record, nclasses, nsegments;
    uint64_t segments_free, segments_class, segments_extent;
    uint64_t allocated_records, allocated_bytes; /* bytes: whole records (headers included) and extents */
    uint64_t requested_bytes;                    /* payload bytes asked for by live allocations */
    uint64_t free_records_pool, free_records_threads, unused_slots; /* free lists; never-used slots of partial segments */
    uint64_t extents, extent_bytes;
    uint64_t background_runs, background_moves, moved_records;
    uint64_t recovered_records, recovery_ns, recovered_bytes_scanned;
    uint32_t recovery_threads, threads_cached;
    int durable, persist_kind, is_pmem, anonymous;
    double fragmentation; /* 1 - requested bytes / bytes of segments in use */
    int membarrier;       /* 1: thread caches are guarded by membarrier; 0: by a spin lock (pmem_membarrier off, or none) */
} rtkit_pmem_stats;

typedef struct rtkit_pmem_class_stats {
    uint32_t cls, record_size, segments, pad;
    int64_t allocated;           /* live records of this class */
    uint64_t free_pool, free_threads, unused_slots;
} rtkit_pmem_class_stats;

typedef struct rtkit_pmem_check_report {
    uint32_t version, block_size, max_record, nclasses;
    uint64_t pool_size, segment_size, nsegments, data_offset, uuid;
    uint64_t segments_free, segments_class, segments_extent;
    uint64_t records_allocated, records_free, records_torn, bytes_allocated, requested_bytes;
    uint64_t extents, extent_bytes;
    uint64_t open_count, errors;
    int clean; /* 1: closed cleanly last time */
    char first_error[256];
} rtkit_pmem_check_report;

void rtkit_pmem_options_init(rtkit_pmem_options *opts);
int rtkit_pmem_create(const char *path, uint64_t size, const rtkit_pmem_options *opts, rtkit_pmem_pool **out);
int rtkit_pmem_open(const char *path, const rtkit_pmem_options *opts, rtkit_pmem_pool **out);
int rtkit_pmem_anonymous(uint64_t size, const rtkit_pmem_options *opts, rtkit_pmem_pool **out);
int rtkit_pmem_close(rtkit_pmem_pool *pool);

int rtkit_pmem_alloc(rtkit_pmem_pool *pool, uint64_t nbytes, uint64_t *handle);
int rtkit_pmem_free(rtkit_pmem_pool *pool, uint64_t handle);
void *rtkit_pmem_ptr(rtkit_pmem_pool *pool, uint64_t handle);       /* no check; NULL for 0 */
uint64_t rtkit_pmem_handle(rtkit_pmem_pool *pool, const void *ptr);  /* 0 when outside the pool */
void *rtkit_pmem_base(rtkit_pmem_pool *pool);
/* size of the live record at handle: requested bytes and usable bytes */
int rtkit_pmem_record_size(rtkit_pmem_pool *pool, uint64_t handle, uint64_t *requested, uint64_t *usable);
/* persist [handle+offset, +len) of a record (len 0: to the end of the record) */
int rtkit_pmem_persist(rtkit_pmem_pool *pool, uint64_t handle, uint64_t offset, uint64_t len);
int rtkit_pmem_persist_range(rtkit_pmem_pool *pool, const void *addr, uint64_t len);
int rtkit_pmem_sync(rtkit_pmem_pool *pool); /* persist the whole pool (volatile mode's group commit) */
/* next live record after handle `after` (0: the first); 0 with *handle = 0 at the end */
int rtkit_pmem_next(rtkit_pmem_pool *pool, uint64_t after, uint64_t *handle, uint64_t *requested);
int rtkit_pmem_stats_get(rtkit_pmem_pool *pool, rtkit_pmem_stats *out);
int rtkit_pmem_class_stats_get(rtkit_pmem_pool *pool, uint32_t cls, rtkit_pmem_class_stats *out);
int rtkit_pmem_rebalance_now(rtkit_pmem_pool *pool); /* one background pass, now (tests) */
void rtkit_pmem_thread_release(rtkit_pmem_pool *pool); /* give this thread's cache back now */

/* offline: verify a pool file without changing it (ECORRUPT when errors > 0); info reads the layout only */
int rtkit_pmem_check(const char *path, rtkit_pmem_check_report *report);
int rtkit_pmem_info(const char *path, rtkit_pmem_check_report *report);

const char *rtkit_pmem_last_error(void);
const char *rtkit_pmem_strerror(int code);
int rtkit_pmem_version(void);

#ifdef __cplusplus
}
#endif
#endif
