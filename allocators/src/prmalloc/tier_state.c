/* tier_state.c -- the tier's shared state, defined apart from its users so the tier files call each other one way. */
#include "prmalloc/tier_internal.h"

size_t rtk_tier_min = SIZE_MAX;
int rtk_tier_pre = 1;  /* 1 until the first step mark */
rtk_tier_t rtk_tier = {.fd = -1, .live_lock = RTK_SPIN_INIT};
rtk_tier_view_t rtk_tier_view;
