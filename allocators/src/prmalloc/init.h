/* init.h -- lazy, re-entrant-safe initialisation of PRMalloc (settings, census, plan), called by every entry point. */
#ifndef RTK_PRMALLOC_INIT_H
#define RTK_PRMALLOC_INIT_H

#include "prmalloc/state.h"

RTK_HIDDEN void rtk_init(void);

#endif
