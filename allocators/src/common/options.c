/* options.c -- RTKIT_* settings for PRMalloc and PMEM: the generated table, its grammar (that of rtkit/config.py),
 * one reader per kind with the table's limits, the value array, its loading loop and its echo; no malloc. */
#include "common/options.h"

#include <ctype.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/say.h"

static const char *g_note[RTK_OPT_COUNT];
static char *g_sink;
static size_t g_sink_cap;
static int g_quiet;

const rtk_setting_t rtk_settings[RTK_OPT_COUNT] = {
#define RTK_OPT_ROW(ID, KEY, ENV, KIND, DFLT, DTEXT, HMIN, MIN, HMAX, MAX, PART, ALIAS, INV) \
    {KEY, ENV, KIND, DFLT, DTEXT, HMIN, HMAX, MIN, MAX, PART, ALIAS, INV},
    RTK_SETTINGS(RTK_OPT_ROW)
#undef RTK_OPT_ROW
};

rtk_value_t rtk_values[RTK_OPT_COUNT];
static unsigned char g_loaded[RTK_OPT_COUNT], g_bad[RTK_OPT_COUNT];

void rtk_opt_set_fallback_note(rtk_opt_t id, const char *note) { g_note[id] = note; }

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

static const char *raw_value(const char *name)
{
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

const char *rtk_opt_internal(const char *name) { return raw_value(name); }

/* A setting's value as set: under its name, else under its old name (*name says which variable it was). */
static const char *setting_raw(const rtk_setting_t *s, const char **name)
{
    const char *v = raw_value(s->env);
    *name = s->env;
    if (!v && s->alias_env[0] && (v = raw_value(s->alias_env)))
        *name = s->alias_env;
    return v;
}

/* 1 when the value came from the old name of a boolean that meant the opposite */
static int inverted(const rtk_setting_t *s, const char *name) { return s->alias_inverted && name != s->env; }

const char *rtk_opt_str(rtk_opt_t id)
{
    const char *name;
    return setting_raw(&rtk_settings[id], &name);
}

int rtk_opt_given(rtk_opt_t id) { return rtk_opt_str(id) != NULL; }

static void report_bad(const rtk_setting_t *s, const char *name, const char *raw, const char *accepted)
{
    char msg[512];
    char tail[128];
    const char *note = g_note[s - rtk_settings];
    if (note)
        snprintf(tail, sizeof tail, "%s", note);
    else
        snprintf(tail, sizeof tail, "using the default '%s'", s->dflt_text);
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

/* the same words as Setting.accepted() in rtkit/config.py */
static void accepted_text(const rtk_setting_t *s, char *buf, size_t cap)
{
    const char *what = s->kind == RTK_KIND_SIZE ? "a size such as 4096, 64K, 1M or 2G" : "a whole number";
    if (s->has_min && s->has_max)
        snprintf(buf, cap, "%s (>= %lld, <= %lld)", what, s->min, s->max);
    else if (s->has_min)
        snprintf(buf, cap, "%s (>= %lld)", what, s->min);
    else if (s->has_max)
        snprintf(buf, cap, "%s (<= %lld)", what, s->max);
    else
        snprintf(buf, cap, "%s", what);
}

/* a size or whole number that did not parse or is out of the table's range: one line, the default stays */
static int reject_number(const rtk_setting_t *s, const char *name, const char *raw)
{
    char acc[160];
    accepted_text(s, acc, sizeof acc);
    report_bad(s, name, raw, acc);
    return -1;
}

int rtk_opt_size(rtk_opt_t id, size_t *out)
{
    const rtk_setting_t *s = &rtk_settings[id];
    const char *name, *raw = setting_raw(s, &name);
    *out = (size_t)s->dflt;
    if (!raw)
        return 0;
    size_t v;
    if (rtk_parse_size(raw, &v) == 0 && (!s->has_min || v >= (size_t)s->min) && (!s->has_max || v <= (size_t)s->max)) {
        *out = v;
        return 0;
    }
    return reject_number(s, name, raw);
}

int rtk_opt_int(rtk_opt_t id, long *out)
{
    const rtk_setting_t *s = &rtk_settings[id];
    const char *name, *raw = setting_raw(s, &name);
    *out = (long)s->dflt;
    if (!raw)
        return 0;
    long v;
    if (rtk_parse_int(raw, &v) == 0 && (!s->has_min || v >= s->min) && (!s->has_max || v <= s->max)) {
        *out = v;
        return 0;
    }
    return reject_number(s, name, raw);
}

int rtk_opt_bool(rtk_opt_t id, int *out)
{
    const rtk_setting_t *s = &rtk_settings[id];
    const char *name, *raw = setting_raw(s, &name);
    *out = (int)s->dflt;
    if (!raw)
        return 0;
    int v;
    if (rtk_parse_bool(raw, &v) == 0) {
        *out = inverted(s, name) ? !v : v;
        return 0;
    }
    report_bad(s, name, raw, "one of 1/0/true/false/on/off");
    return -1;
}

/* one setting into its slot of rtk_values: 0, or -1 with the message in msg */
static int load_one(rtk_opt_t id, char *msg, size_t cap)
{
    rtk_value_t *v = &rtk_values[id];
    int rc = 0;
    char *sink = g_sink;
    size_t sink_cap = g_sink_cap;
    int quiet = g_quiet;
    g_sink = msg;
    g_sink_cap = cap;
    g_quiet = 1;
    switch (rtk_settings[id].kind) {
    case RTK_KIND_BOOL: rc = rtk_opt_bool(id, &v->on); break;
    case RTK_KIND_INT: rc = rtk_opt_int(id, &v->num); break;
    case RTK_KIND_SIZE: rc = rtk_opt_size(id, &v->bytes); break;
    default: v->text = rtk_opt_str(id); break;
    }
    g_sink = sink;
    g_sink_cap = sink_cap;
    g_quiet = quiet;
    return rc;
}

int rtk_opt_load(int parts)
{
    int bad = 0;
    for (int id = 0; id < RTK_OPT_COUNT; id++) {
        if (!(rtk_settings[id].part & parts) || g_loaded[id])
            continue;
        char msg[320] = "";
        const rtk_setting_t *s = &rtk_settings[id];
        const char *name;
        if (setting_raw(s, &name) && name != s->env) {  /* the old name: said as the Python side says it */
            snprintf(msg, sizeof msg, "environment %s is renamed %s%s: use the new name (the old one is read until "
                     "the next release)", name, s->env, s->alias_inverted ? "; its value is the opposite" : "");
            rtk_keep_message(s->part, msg);
        }
        if (load_one((rtk_opt_t)id, msg, sizeof msg) != 0) {
            g_bad[id] = 1;
            rtk_keep_message(rtk_settings[id].part, msg);
            bad++;
        }
        g_loaded[id] = 1;
    }
    return bad;
}

int rtk_opt_bad(rtk_opt_t id) { return g_bad[id]; }

void rtk_opt_echo(rtk_out_t *o, int parts, rtk_in_force_fn in_force)
{
    int first = 1;
    for (int id = 0; id < RTK_OPT_COUNT; id++) {
        const rtk_setting_t *s = &rtk_settings[id];
        if (!(s->part & parts))
            continue;
        rtk_out_put(o, "%s\"%s\": ", first ? "" : ", ", s->key);
        first = 0;
        rtk_value_t v = in_force ? in_force((rtk_opt_t)id, rtk_values[id]) : rtk_values[id];
        switch (s->kind) {
        case RTK_KIND_BOOL: rtk_out_put(o, "%s", v.on ? "true" : "false"); break;
        case RTK_KIND_INT: rtk_out_put(o, "%ld", v.num); break;
        case RTK_KIND_SIZE: rtk_out_put(o, "%zu", v.bytes); break;
        default: rtk_out_str(o, v.text); break;
        }
    }
}
