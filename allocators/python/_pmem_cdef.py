# _pmem_cdef.py -- the cffi declarations of librtkit_pmem.so (kept in step with allocators/include/rtkit/pmem.h).
CDEF = """
typedef struct rtkit_pmem_pool rtkit_pmem_pool;
typedef struct rtkit_pmem_options {
    uint64_t segment_size;
    uint32_t block_size;
    uint32_t max_record;
    uint64_t expect_size;
    int durable;
    int rebalance_ms;
    int rebalance_min;
    int recovery_threads;
    int force_msync;
} rtkit_pmem_options;
typedef struct rtkit_pmem_stats {
    uint64_t pool_size, segment_size, data_offset;
    uint32_t block_size, max_record, nclasses, nsegments;
    uint64_t segments_free, segments_class, segments_extent;
    uint64_t allocated_records, allocated_bytes;
    uint64_t requested_bytes;
    uint64_t free_records_pool, free_records_threads, unused_slots;
    uint64_t extents, extent_bytes;
    uint64_t background_runs, background_moves, moved_records;
    uint64_t recovered_records, recovery_ns, recovered_bytes_scanned;
    uint32_t recovery_threads, threads_cached;
    int durable, persist_kind, is_pmem, anonymous;
    double fragmentation;
    int membarrier;
} rtkit_pmem_stats;
typedef struct rtkit_pmem_class_stats {
    uint32_t cls, record_size, segments, pad;
    int64_t allocated;
    uint64_t free_pool, free_threads, unused_slots;
} rtkit_pmem_class_stats;
typedef struct rtkit_pmem_check_report {
    uint32_t version, block_size, max_record, nclasses;
    uint64_t pool_size, segment_size, nsegments, data_offset, uuid;
    uint64_t segments_free, segments_class, segments_extent;
    uint64_t records_allocated, records_free, records_torn, bytes_allocated, requested_bytes;
    uint64_t extents, extent_bytes;
    uint64_t open_count, errors;
    int clean;
    char first_error[256];
} rtkit_pmem_check_report;
void rtkit_pmem_options_init(rtkit_pmem_options *opts);
int rtkit_pmem_create(const char *path, uint64_t size, const rtkit_pmem_options *opts, rtkit_pmem_pool **out);
int rtkit_pmem_open(const char *path, const rtkit_pmem_options *opts, rtkit_pmem_pool **out);
int rtkit_pmem_anonymous(uint64_t size, const rtkit_pmem_options *opts, rtkit_pmem_pool **out);
int rtkit_pmem_close(rtkit_pmem_pool *pool);
int rtkit_pmem_alloc(rtkit_pmem_pool *pool, uint64_t nbytes, uint64_t *handle);
int rtkit_pmem_free(rtkit_pmem_pool *pool, uint64_t handle);
void *rtkit_pmem_ptr(rtkit_pmem_pool *pool, uint64_t handle);
uint64_t rtkit_pmem_handle(rtkit_pmem_pool *pool, const void *ptr);
void *rtkit_pmem_base(rtkit_pmem_pool *pool);
int rtkit_pmem_record_size(rtkit_pmem_pool *pool, uint64_t handle, uint64_t *requested, uint64_t *usable);
int rtkit_pmem_persist(rtkit_pmem_pool *pool, uint64_t handle, uint64_t offset, uint64_t len);
int rtkit_pmem_persist_range(rtkit_pmem_pool *pool, const void *addr, uint64_t len);
int rtkit_pmem_sync(rtkit_pmem_pool *pool);
int rtkit_pmem_next(rtkit_pmem_pool *pool, uint64_t after, uint64_t *handle, uint64_t *requested);
int rtkit_pmem_stats_get(rtkit_pmem_pool *pool, rtkit_pmem_stats *out);
int rtkit_pmem_class_stats_get(rtkit_pmem_pool *pool, uint32_t cls, rtkit_pmem_class_stats *out);
int rtkit_pmem_rebalance_now(rtkit_pmem_pool *pool);
void rtkit_pmem_thread_release(rtkit_pmem_pool *pool);
int rtkit_pmem_check(const char *path, rtkit_pmem_check_report *report);
int rtkit_pmem_info(const char *path, rtkit_pmem_check_report *report);
const char *rtkit_pmem_last_error(void);
const char *rtkit_pmem_strerror(int code);
int rtkit_pmem_version(void);
"""
