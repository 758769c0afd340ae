/* recover.h -- rebuilding a pool's volatile state when it is opened (recover.c). */
#ifndef RTK_PMEM_RECOVER_H
#define RTK_PMEM_RECOVER_H
#include "pmem/pool.h"

/* 0, or the failure's code (ECORRUPT names the first inconsistency) */
int rtk_recover(struct rtkit_pmem_pool *p);
void rtk_write_summaries(struct rtkit_pmem_pool *p);
#endif
