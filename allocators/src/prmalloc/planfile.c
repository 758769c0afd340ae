/* planfile.c -- the plan file: its versioned text (format, parse), its guards (docs/safety.md: bounded reading, the
 * plan's cost checked once, only the process that marks steps or the one the user names reserves), load and save. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/options.h"
#include "common/os.h"
#include "prmalloc/planfile.h"
#include "rtkit/prmalloc.h"

static char g_plan_text[64 << 10];  /* one plan file's text: loaded or saved under the step lock */


uint64_t rtk_plan_fingerprint(const rtk_plan_t *p)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < p->nclasses; i++) {
        uint64_t v[3] = {p->cls[i].size, p->cls[i].blocks, p->cls[i].align};
        const unsigned char *b = (const unsigned char *)v;
        for (size_t k = 0; k < sizeof v; k++) {
            h ^= b[k];
            h *= 1099511628211ull;
        }
    }
    return h;
}

int rtk_plan_format(const rtk_plan_t *p, size_t min_size, char *buf, size_t cap)
{
    size_t off = 0;
    int n = snprintf(buf, cap,
                     "rtkit-malloc-plan %d\n"
                     "# written by librtkit_malloc.so; load with %s=<this file> or rtkit run --plan\n"
                     "spacing %s\nmin_size %zu\nreserved_bytes %zu\nstep_peak_bytes %zu\nfingerprint %016llx\nclasses %d\n",
                     RTKIT_MALLOC_PLAN_VERSION, rtk_settings[RTK_OPT_MALLOC_PLAN].env, rtk_spacing_name[p->spacing], min_size, p->reserved,
                     p->step_peak,
                     (unsigned long long)rtk_plan_fingerprint(p), p->nclasses);
    if (n < 0 || (size_t)n >= cap)
        return -1;
    off = (size_t)n;
    for (int i = 0; i < p->nclasses; i++) {
        n = snprintf(buf + off, cap - off, "class %zu %u %u\n", p->cls[i].size, p->cls[i].blocks, p->cls[i].align);
        if (n < 0 || (size_t)n >= cap - off)
            return -1;
        off += (size_t)n;
    }
    n = snprintf(buf + off, cap - off, "end\n");
    if (n < 0 || (size_t)n >= cap - off)
        return -1;
    return (int)(off + (size_t)n);
}

static const char *next_line(const char *s, char *line, size_t cap)
{
    size_t n = 0;
    while (*s && *s != '\n') {
        if (n + 1 < cap)
            line[n++] = *s;
        s++;
    }
    line[n] = 0;
    return *s ? s + 1 : s;
}

#define WHY(...) do { snprintf(why, why_cap, __VA_ARGS__); return -1; } while (0)

int rtk_plan_parse(const char *text, rtk_plan_t *out, char *why, size_t why_cap)
{
    char line[256];
    const char *s = text;
    int version = -1, declared = -1, have_fp = 0, ended = 0;
    unsigned long long fp = 0;
    memset(out, 0, sizeof *out);
    s = next_line(s, line, sizeof line);
    if (sscanf(line, "rtkit-malloc-plan %d", &version) != 1)
        WHY("not an rtkit malloc plan (first line '%.40s')", line);
    if (version != RTKIT_MALLOC_PLAN_VERSION)
        WHY("plan format version %d, this library reads version %d", version, RTKIT_MALLOC_PLAN_VERSION);
    while (*s && !ended) {
        s = next_line(s, line, sizeof line);
        if (line[0] == '#' || line[0] == 0)
            continue;
        char word[32], arg[64];
        size_t size;
        unsigned blocks, align;
        if (sscanf(line, "class %zu %u %u", &size, &blocks, &align) == 3) {
            if (out->nclasses >= RTK_MAX_CLASSES)
                WHY("more than %d classes", RTK_MAX_CLASSES);
            if (size == 0 || size % RTK_MIN_BLOCK_ALIGN || blocks == 0 || align < RTK_MIN_BLOCK_ALIGN ||
                align > RTK_MAX_BLOCK_ALIGN || (align & (align - 1)) || size % align ||
                size > ((size_t)1 << 40) / blocks)
                WHY("bad class line '%.60s'", line);
            rtk_class_t *c = &out->cls[out->nclasses++];
            c->size = size;
            c->blocks = blocks;
            c->align = align;
        } else if (sscanf(line, "%31s %63s", word, arg) == 2) {
            if (!strcmp(word, "spacing")) {
                for (int i = 0; i < RTK_SPACINGS; i++)
                    if (!strcmp(arg, rtk_spacing_name[i]))
                        out->spacing = i;
            } else if (!strcmp(word, "fingerprint")) {
                fp = strtoull(arg, NULL, 16);
                have_fp = 1;
            } else if (!strcmp(word, "min_size")) {
                unsigned long long v = strtoull(arg, NULL, 10);
                if (v < 16 || v > ((size_t)1 << 40))
                    WHY("bad min_size line '%.60s'", line);
                out->min_size = (size_t)v;
            } else if (!strcmp(word, "step_peak_bytes")) {
                out->step_peak = (size_t)strtoull(arg, NULL, 10);  /* a figure for the report only: not checked */
            } else if (!strcmp(word, "classes")) {
                declared = atoi(arg);
            }
        } else if (!strcmp(line, "end")) {
            ended = 1;
        }
    }
    if (!ended)
        WHY("plan file is truncated (no 'end' line)");
    if (declared != out->nclasses)
        WHY("plan declares %d classes but lists %d", declared, out->nclasses);
    for (int i = 1; i < out->nclasses; i++)
        if (out->cls[i].size <= out->cls[i - 1].size)
            WHY("classes are not in increasing size order");
    if (!have_fp || fp != rtk_plan_fingerprint(out))
        WHY("fingerprint mismatch: the plan file was edited or is corrupt");
    out->reserved = rtk_plan_reserved(out, 4096);
    return 0;
}

static long read_text(const char *path, char *buf, size_t cap, char *why, size_t why_cap)
{
    long n = rtk_os_read_file_flags(path, buf, cap, RTK_READ_NOFOLLOW);
    if (n < 0) {
        if (n == -EFBIG)
            snprintf(why, why_cap, "cannot read plan file: larger than %zu bytes, not a plan", cap - 1);
        else
            snprintf(why, why_cap, "cannot read plan file: %s", rtk_os_read_error(n));
        return -1;
    }
    return n;
}

static int fits(const rtk_plan_t *p, size_t limit, size_t page, char *why, size_t why_cap)
{
    /* what the arena takes: whole pages per block (a 64-byte class costs a page a block). The parser bounds
     * size x blocks to 1 TiB, so a class is below 2^45 here and the sum over RTK_MAX_CLASSES cannot overflow */
    size_t total = rtk_plan_reserved(p, page);
    size_t phys = (size_t)rtk_os_phys_bytes();
    if (total > limit) {
        snprintf(why, why_cap, "plan reserves %zu bytes, more than %s=%zu", total,
                 rtk_settings[RTK_OPT_MALLOC_ARENA_LIMIT].env, limit);
        return -1;
    }
    if (phys && total > phys) {
        snprintf(why, why_cap, "plan reserves %zu bytes, more than this machine's memory (%zu bytes)", total, phys);
        return -1;
    }
    return 0;
}

int rtk_planfile_load(const char *path, size_t limit, rtk_plan_t *out, char *why, size_t why_cap)
{
    if (read_text(path, g_plan_text, sizeof g_plan_text, why, why_cap) < 0)
        return -1;
    if (rtk_plan_parse(g_plan_text, out, why, why_cap) != 0) {
        out->nclasses = 0;
        return -2;
    }
    if (fits(out, limit, rtk_os_page_size(), why, why_cap) != 0) {
        out->nclasses = 0;
        return -1;
    }
    return 0;
}

int rtk_planfile_save(const rtk_plan_t *p, size_t min_size, const char *run_dir, char *path, size_t path_cap)
{
    char at[1100];
    if (snprintf(at, sizeof at, "%s/malloc-plan.txt", run_dir) >= (int)sizeof at)
        return -1;
    int n = rtk_plan_format(p, min_size, g_plan_text, sizeof g_plan_text);
    if (n <= 0 || rtk_os_write_file_atomic(at, g_plan_text, (size_t)n) != 0)
        return -1;
    snprintf(path, path_cap, "%s", at);
    return 0;
}

int rtk_planfile_reserve_at_start(void)
{
    const char *named = rtk_opt_str(RTK_OPT_MALLOC_PLAN_PROCESS);
    return named && program_invocation_short_name && !strcmp(named, program_invocation_short_name);
}
