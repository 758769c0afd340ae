/* jsonbuf.h -- bounded text buffer for the JSON statistics files, written without malloc. */
#ifndef RTK_COMMON_JSONBUF_H
#define RTK_COMMON_JSONBUF_H

#include <stddef.h>

/* Output into a caller-owned buffer; once it would overflow, `full` is set and further output is dropped. */
typedef struct { char *buf; size_t cap, off; int full; } rtk_out_t;

__attribute__((visibility("hidden"), format(printf, 2, 3)))
void rtk_out_put(rtk_out_t *o, const char *fmt, ...);

/* A JSON string literal: quotes, backslashes and control characters escaped. */
__attribute__((visibility("hidden")))
void rtk_out_str(rtk_out_t *o, const char *s);

#endif
