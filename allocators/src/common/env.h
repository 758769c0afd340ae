/* env.h -- parsing of RTKIT_* environment settings with the grammar of rtkit/config.py (sizes, booleans, ints). */
#ifndef RTK_COMMON_ENV_H
#define RTK_COMMON_ENV_H

#include <stddef.h>

#include "common/log.h"

/* Pure parsers: 0 on success, -1 when the text is not valid. No logging.
 * Sizes: digits, optional K/M/G/T (binary multiples), optional "B"/"iB", surrounding spaces allowed.
 * Booleans: 1/0/true/false/on/off/yes/no (any case). Ints: optional sign and digits. */
RTK_HIDDEN int rtk_parse_size(const char *text, size_t *out);
RTK_HIDDEN int rtk_parse_bool(const char *text, int *out);
RTK_HIDDEN int rtk_parse_int(const char *text, long *out);

/* Environment readers. Unset (or empty) variable: *out = dflt, returns 0. Valid: *out = value, returns 0.
 * Bad or out of [min, max]: *out = dflt, prints ONE stderr line naming the variable, the value and what is
 * accepted, followed by the fallback note (see rtk_env_set_fallback_note), and returns -1.
 * The message (without "rtkit: ") is also copied to the buffer given to rtk_env_set_error_sink, if any. */
RTK_HIDDEN int rtk_env_size(const char *name, size_t dflt, size_t min, size_t max, size_t *out);
RTK_HIDDEN int rtk_env_bool(const char *name, int dflt, int *out);
RTK_HIDDEN int rtk_env_int(const char *name, long dflt, long min, long max, long *out);
/* The raw value, or NULL when unset or empty. */
RTK_HIDDEN const char *rtk_env_str(const char *name);

/* What the caller does on a bad value, appended to the message, e.g. "the allocator runs as a plain
 * pass-through". NULL (the default) appends "using the default '<dflt>'". The string must stay valid. */
RTK_HIDDEN void rtk_env_set_fallback_note(const char *note);
/* Optional sink for the last error message (no allocation: the caller owns the buffer). */
RTK_HIDDEN void rtk_env_set_error_sink(char *buf, size_t cap);
/* Suppress the stderr line (the message still reaches the sink); used when a caller reports once itself. */
RTK_HIDDEN void rtk_env_set_quiet(int quiet);

#endif
