/* pool_setup.h -- the parts a pool's open, create and close are made of (pool_setup.c), for pool.c. */
#ifndef RTK_PMEM_POOL_SETUP_H
#define RTK_PMEM_POOL_SETUP_H

#include "pmem/pool.h"

/* The pool object and its tables for geometry g (path NULL: anonymous); NULL when out of memory. */
struct rtkit_pmem_pool *rtk_pool_new(const struct rtk_geom *g, const char *path);
/* Unmap the data, close the file and free the tables: the pool object is gone. */
void rtk_pool_release(struct rtkit_pmem_pool *p);
/* Undo a half-made open: its thread key too. */
void rtk_pool_abort_open(struct rtkit_pmem_pool *p);
/* Map p->fd's pool (libpmem where built with it) and choose how stores are persisted. */
int rtk_pool_map_file(struct rtkit_pmem_pool *p, const char *path, int force_msync);
/* Settings, thread key, membarrier, recovery and the background thread of a mapped pool: 0 or the error. */
int rtk_pool_finish_open(struct rtkit_pmem_pool *p, const rtkit_pmem_options *o);
/* The geometry of a new pool: each size from the options, else from the pmem_* settings. */
int rtk_pool_geometry(const rtkit_pmem_options *o, uint64_t size, const char *what, struct rtk_geom *g);
void rtk_pool_init_header(struct rtkit_pmem_pool *p);
uint64_t rtk_pool_new_uuid(void);
/* Pools open in this process: note one (add 1) or its close (add 0); whether fd's file is one of them. */
void rtk_pool_note_open(struct rtkit_pmem_pool *p, int add);
int rtk_pool_open_here(int fd);

#endif
