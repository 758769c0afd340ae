/* env.c -- RTKIT_* value parsing shared by PRMalloc and PMEM; same grammar as rtkit/config.py, no malloc. */
#include "common/env.h"

#include <ctype.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *g_note;
static char *g_sink;
static size_t g_sink_cap;
static int g_quiet;

void rtk_env_set_fallback_note(const char *note) { g_note = note; }
void rtk_env_set_error_sink(char *buf, size_t cap) { g_sink = buf; g_sink_cap = cap; }
void rtk_env_set_quiet(int quiet) { g_quiet = quiet; }

int rtk_parse_size(const char *s, size_t *out)
{
    if (!s)
        return -1;
    while (isspace((unsigned char)*s))
        s++;
    if (!isdigit((unsigned char)*s))
        return -1;
    uint64_t v = 0;
    while (isdigit((unsigned char)*s)) {
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
        s++;
    }
    while (isspace((unsigned char)*s))
        s++;
    unsigned shift = 0;
    switch (*s) {
    case 'k': case 'K': shift = 10; s++; break;
    case 'm': case 'M': shift = 20; s++; break;
    case 'g': case 'G': shift = 30; s++; break;
    case 't': case 'T': shift = 40; s++; break;
    default: break;
    }
    if (*s == 'i' && (s[1] == 'b' || s[1] == 'B'))
        s += 2;
    else if (*s == 'b' || *s == 'B')
        s++;
    while (isspace((unsigned char)*s))
        s++;
    if (*s)
        return -1;
    if (shift && v > (SIZE_MAX >> shift))
        return -1;
    *out = (size_t)(v << shift);
    return 0;
}

int rtk_parse_bool(const char *s, int *out)
{
    if (!s)
        return -1;
    char buf[8];
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    static const char *yes[] = {"1", "true", "on", "yes"}, *no[] = {"0", "false", "off", "no"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(buf, yes[i])) { *out = 1; return 0; }
        if (!strcasecmp(buf, no[i])) { *out = 0; return 0; }
    }
    return -1;
}

int rtk_parse_int(const char *s, long *out)
{
    if (!s)
        return -1;
    while (isspace((unsigned char)*s))
        s++;
    int neg = 0;
    if (*s == '+' || *s == '-')
        neg = (*s++ == '-');
    if (!isdigit((unsigned char)*s))
        return -1;
    long v = 0;
    while (isdigit((unsigned char)*s)) {
        long d = *s - '0';
        if (v > (LONG_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
        s++;
    }
    while (isspace((unsigned char)*s))
        s++;
    if (*s)
        return -1;
    *out = neg ? -v : v;
    return 0;
}

const char *rtk_env_str(const char *name)
{
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

static void report_bad(const char *name, const char *raw, const char *accepted, const char *dflt_text)
{
    char msg[512];
    char tail[128];
    if (g_note)
        snprintf(tail, sizeof tail, "%s", g_note);
    else
        snprintf(tail, sizeof tail, "using the default '%s'", dflt_text);
    snprintf(msg, sizeof msg, "environment %s='%.80s' is not valid: expected %s; %s", name, raw, accepted, tail);
    if (g_sink && g_sink_cap) {
        size_t n = strlen(msg);
        if (n >= g_sink_cap)
            n = g_sink_cap - 1;
        memcpy(g_sink, msg, n);
        g_sink[n] = 0;
    }
    if (!g_quiet)
        rtk_log_line("%s", msg);
}

static void bounds_text(char *buf, size_t cap, const char *what, unsigned long long min, unsigned long long max,
                        int has_min, int has_max)
{
    if (has_min && has_max)
        snprintf(buf, cap, "%s (>= %llu, <= %llu)", what, min, max);
    else if (has_min)
        snprintf(buf, cap, "%s (>= %llu)", what, min);
    else if (has_max)
        snprintf(buf, cap, "%s (<= %llu)", what, max);
    else
        snprintf(buf, cap, "%s", what);
}

int rtk_env_size(const char *name, size_t dflt, size_t min, size_t max, size_t *out)
{
    const char *raw = rtk_env_str(name);
    *out = dflt;
    if (!raw)
        return 0;
    size_t v;
    if (rtk_parse_size(raw, &v) == 0 && v >= min && v <= max) {
        *out = v;
        return 0;
    }
    char acc[160], d[32];
    bounds_text(acc, sizeof acc, "a size such as 4096, 64K, 1M or 2G", min, max, min > 0, max != SIZE_MAX);
    snprintf(d, sizeof d, "%zu", dflt);
    report_bad(name, raw, acc, d);
    return -1;
}

int rtk_env_bool(const char *name, int dflt, int *out)
{
    const char *raw = rtk_env_str(name);
    *out = dflt;
    if (!raw)
        return 0;
    int v;
    if (rtk_parse_bool(raw, &v) == 0) {
        *out = v;
        return 0;
    }
    report_bad(name, raw, "one of 1/0/true/false/on/off", dflt ? "1" : "0");
    return -1;
}

int rtk_env_int(const char *name, long dflt, long min, long max, long *out)
{
    const char *raw = rtk_env_str(name);
    *out = dflt;
    if (!raw)
        return 0;
    long v;
    if (rtk_parse_int(raw, &v) == 0 && v >= min && v <= max) {
        *out = v;
        return 0;
    }
    char acc[160], d[32];
    if (min != LONG_MIN && max != LONG_MAX)
        snprintf(acc, sizeof acc, "a whole number (>= %ld, <= %ld)", min, max);
    else if (min != LONG_MIN)
        snprintf(acc, sizeof acc, "a whole number (>= %ld)", min);
    else if (max != LONG_MAX)
        snprintf(acc, sizeof acc, "a whole number (<= %ld)", max);
    else
        snprintf(acc, sizeof acc, "a whole number");
    snprintf(d, sizeof d, "%ld", dflt);
    report_bad(name, raw, acc, d);
    return -1;
}
