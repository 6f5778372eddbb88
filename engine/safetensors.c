/* safetensors.c — see safetensors.h */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"
#include "util.h"

static const struct {
    const char *name;
    StDtype dtype;
    size_t size;
} DTYPES[] = {
    {"F64", ST_F64, 8}, {"F32", ST_F32, 4}, {"F16", ST_F16, 2}, {"BF16", ST_BF16, 2},
    {"I64", ST_I64, 8}, {"I32", ST_I32, 4}, {"I16", ST_I16, 2}, {"I8", ST_I8, 1},
    {"U8", ST_U8, 1},   {"BOOL", ST_BOOL, 1},
};
#define N_DTYPES (sizeof DTYPES / sizeof DTYPES[0])

const char *st_dtype_name(StDtype d) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (DTYPES[i].dtype == d) return DTYPES[i].name;
    return "?";
}

size_t st_dtype_size(StDtype d) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (DTYPES[i].dtype == d) return DTYPES[i].size;
    return 0;
}

/* a JSON number that is a non-negative integer below 2^53 (exactly representable) */
static int as_index(const JsonValue *v, uint64_t *out) {
    if (!v || v->type != JSON_NUMBER) return -1;
    double d = v->number;
    if (!(d >= 0.0) || d > 9007199254740992.0 || floor(d) != d) return -1;
    *out = (uint64_t)d;
    return 0;
}

static void free_tensors(SafeTensors *st) {
    for (int i = 0; i < st->count; i++) free(st->tensors[i].name);
    free(st->tensors);
    free(st->by_name);
    st->tensors = NULL;
    st->by_name = NULL;
    st->count = 0;
}

/* qsort has no context argument: the tensors being sorted, set around the one call */
static const StTensor *sorting;

static int by_name_order(const void *a, const void *b) {
    return strcmp(sorting[*(const int *)a].name, sorting[*(const int *)b].name);
}

/* sort the name index and refuse a name that appears twice: O(n log n) for n tensors (a header
 * with 120k tensors used to take seconds of pairwise comparisons) */
static int index_names(SafeTensors *st) {
    st->by_name = malloc(((size_t)st->count + 1) * sizeof *st->by_name);
    if (!st->by_name) {
        lmc_set_error("out of memory");
        return -1;
    }
    for (int i = 0; i < st->count; i++) st->by_name[i] = i;
    sorting = st->tensors;
    qsort(st->by_name, (size_t)st->count, sizeof *st->by_name, by_name_order);
    sorting = NULL;
    for (int i = 1; i < st->count; i++) {
        const char *name = st->tensors[st->by_name[i]].name;
        if (strcmp(st->tensors[st->by_name[i - 1]].name, name) == 0) {
            lmc_set_error("%s: tensor '%.80s' appears twice in the header", st->path, name);
            return -1;
        }
    }
    return 0;
}

static int parse_entry(SafeTensors *st, const char *name, const JsonValue *e,
                       const uint8_t *data_start, uint64_t data_size, StTensor *t) {
    const char *path = st->path;
    if (e->type != JSON_OBJECT) {
        lmc_set_error("%s: header entry '%s' is a %s, expected an object", path, name,
                      json_type_name(e->type));
        return -1;
    }
    const JsonValue *dtype = json_get(e, "dtype");
    const JsonValue *shape = json_get(e, "shape");
    const JsonValue *offs = json_get(e, "data_offsets");
    if (!dtype || dtype->type != JSON_STRING) {
        lmc_set_error("%s: tensor '%s' has no string 'dtype'", path, name);
        return -1;
    }
    size_t i;
    for (i = 0; i < N_DTYPES; i++)
        if (strcmp(dtype->string, DTYPES[i].name) == 0) break;
    if (i == N_DTYPES) {
        lmc_set_error("%s: tensor '%s' has unsupported dtype '%.32s' (allowed: F32, BF16, F16)",
                      path, name, dtype->string);
        return -1;
    }
    t->dtype = DTYPES[i].dtype;
    if (!shape || shape->type != JSON_ARRAY || shape->count > ST_MAX_DIMS) {
        lmc_set_error("%s: tensor '%s' needs 'shape' as an array of at most %d sizes", path, name,
                      ST_MAX_DIMS);
        return -1;
    }
    t->ndim = (int)shape->count;
    uint64_t numel = 1;
    for (size_t d = 0; d < shape->count; d++) {
        uint64_t dim;
        if (as_index(shape->items[d], &dim) != 0) {
            lmc_set_error("%s: tensor '%s' has a shape entry that is not a non-negative integer",
                          path, name);
            return -1;
        }
        t->shape[d] = (int64_t)dim;
        if (dim != 0 && numel > UINT64_MAX / dim / 8) {
            lmc_set_error("%s: tensor '%s' shape is too large", path, name);
            return -1;
        }
        numel *= dim;
    }
    uint64_t begin, end;
    if (!offs || offs->type != JSON_ARRAY || offs->count != 2 ||
        as_index(offs->items[0], &begin) != 0 || as_index(offs->items[1], &end) != 0) {
        lmc_set_error("%s: tensor '%s' needs 'data_offsets' as [begin, end]", path, name);
        return -1;
    }
    if (begin > end || end > data_size) {
        lmc_set_error("%s: tensor '%s' data_offsets [%llu, %llu] lie outside the data section "
                      "(%llu bytes)", path, name, (unsigned long long)begin,
                      (unsigned long long)end, (unsigned long long)data_size);
        return -1;
    }
    uint64_t expect = numel * DTYPES[i].size;
    if (end - begin != expect) {
        lmc_set_error("%s: tensor '%s' holds %llu bytes but shape x dtype %s needs %llu", path,
                      name, (unsigned long long)(end - begin), DTYPES[i].name,
                      (unsigned long long)expect);
        return -1;
    }
    t->data = data_start + begin;
    t->nbytes = (size_t)expect;
    t->name = strdup(name);
    if (!t->name) {
        lmc_set_error("out of memory");
        return -1;
    }
    return 0;
}

int st_parse(SafeTensors *st, const uint8_t *data, size_t size, const char *path) {
    st->map = data;
    st->map_size = size;
    st->tensors = NULL;
    st->by_name = NULL;
    st->count = 0;
    snprintf(st->path, sizeof st->path, "%s", path);
    if (size < 8) {
        lmc_set_error("%s: file is %zu bytes, too short for a safetensors header", path, size);
        return -1;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
    if (hlen < 2 || hlen > ST_MAX_HEADER || hlen > size - 8) {
        lmc_set_error("%s: bad header length %llu (file has %zu bytes after the length field; "
                      "limit %llu)", path, (unsigned long long)hlen, size - 8,
                      (unsigned long long)ST_MAX_HEADER);
        return -1;
    }
    /* the format allows trailing spaces as padding; JSON whitespace handles them */
    JsonValue *root = json_parse((const char *)data + 8, (size_t)hlen, path);
    if (!root) return -1;
    if (root->type != JSON_OBJECT) {
        lmc_set_error("%s: header is a JSON %s, expected an object", path, json_type_name(root->type));
        json_free(root);
        return -1;
    }
    st->tensors = calloc(root->count ? root->count : 1, sizeof(StTensor));
    if (!st->tensors) {
        lmc_set_error("out of memory");
        json_free(root);
        return -1;
    }
    const uint8_t *data_start = data + 8 + hlen;
    uint64_t data_size = size - 8 - hlen;
    for (size_t i = 0; i < root->count; i++) {
        if (strcmp(root->keys[i], "__metadata__") == 0) continue;
        if (parse_entry(st, root->keys[i], root->items[i], data_start, data_size,
                        &st->tensors[st->count]) != 0)
            goto fail;
        st->count++;
    }
    if (index_names(st) != 0) goto fail;
    json_free(root);
    return 0;
fail:
    json_free(root);
    free_tensors(st);
    return -1;
}

int st_open(SafeTensors *st, const char *path) {
    memset(st, 0, sizeof *st);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        lmc_set_error("cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        lmc_set_error("%s is not a regular file", path);
        close(fd);
        return -1;
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        close(fd);
        lmc_set_error("%s: file is %zu bytes, too short for a safetensors header", path, size);
        return -1;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        lmc_set_error("cannot mmap %s: %s", path, strerror(errno));
        return -1;
    }
#ifdef MADV_NOHUGEPAGE
    /* 4 KiB mappings: the page cache may hold the file in 2 MiB folios, and mapped whole (one
     * fault maps 2 MiB) they keep up to a few MiB of the file resident beside the chunk being
     * converted, however promptly the loader gives chunks back (loader.c) */
    madvise(map, size, MADV_NOHUGEPAGE);
#endif
    if (st_parse(st, map, size, path) != 0) {
        munmap(map, size);
        return -1;
    }
    st->mapped = 1;
    st->opened = sb;
    return 0;
}

void st_close(SafeTensors *st) {
    free_tensors(st);
    if (st->mapped && st->map) munmap((void *)st->map, st->map_size);
    st->map = NULL;
}

const StTensor *st_find(const SafeTensors *st, const char *name) {
    if (!st->by_name) return NULL;
    int lo = 0, hi = st->count;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        const StTensor *t = &st->tensors[st->by_name[mid]];
        int cmp = strcmp(t->name, name);
        if (cmp == 0) return t;
        if (cmp < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

float lmc_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float lmc_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
    if (exp == 0) {
        if (mant == 0) bits = sign;
        else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                mant <<= 1;
            } while (!(mant & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3FF) << 13);
        }
    } else if (exp == 31) bits = sign | 0x7F800000 | (mant << 13);
    else bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

int st_to_f32(const StTensor *t, float *out, size_t count) {
    size_t esize = st_dtype_size(t->dtype);
    if (t->nbytes != count * esize) {
        lmc_set_error("tensor '%s' has %zu bytes, expected %zu", t->name, t->nbytes, count * esize);
        return -1;
    }
    /* memcpy per element: the data in the file need not be aligned */
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case ST_F32: memcpy(out, p, count * 4); break;
    case ST_BF16:
        for (size_t i = 0; i < count; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = lmc_bf16_to_f32(h);
        }
        break;
    case ST_F16:
        for (size_t i = 0; i < count; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = lmc_f16_to_f32(h);
        }
        break;
    default:
        lmc_set_error("tensor '%s' has unsupported dtype %s (allowed: F32, BF16, F16)", t->name,
                      st_dtype_name(t->dtype));
        return -1;
    }
    return 0;
}
