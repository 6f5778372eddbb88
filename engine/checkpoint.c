/* checkpoint.c — see checkpoint.h.
 *
 * The index is {"metadata": {...}, "weight_map": {"tensor name": "shard file name", ...}}.
 * Shard names are refused unless they are plain file names: an index must not make lmc open
 * files outside the model directory. */
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "json.h"
#include "util.h"

static int is_plain_name(const char *s) {
    return s[0] != '\0' && s[0] != '.' && strchr(s, '/') == NULL && strlen(s) < 256;
}

/* the distinct shard names of the weight map, in order of first appearance */
static int shard_names(const JsonValue *map, const char ***out, int *n, const char *path) {
    const char **names = calloc(map->count ? map->count : 1, sizeof *names);
    if (!names) {
        lmc_set_error("out of memory");
        return -1;
    }
    int count = 0;
    for (size_t i = 0; i < map->count; i++) {
        const JsonValue *v = map->items[i];
        if (v->type != JSON_STRING || !is_plain_name(v->string)) {
            lmc_set_error("%s: weight_map entry '%.80s' must name a shard file in the model "
                          "directory (a plain file name)", path, map->keys[i]);
            free(names);
            return -1;
        }
        int seen = 0;
        for (int j = 0; j < count && !seen; j++) seen = strcmp(names[j], v->string) == 0;
        if (seen) continue;
        if (count == CKPT_MAX_SHARDS) {
            lmc_set_error("%s: more than %d shards", path, CKPT_MAX_SHARDS);
            free(names);
            return -1;
        }
        names[count++] = v->string;
    }
    *out = names;
    *n = count;
    return 0;
}

/* every mapped tensor is in the shard the map names; no tensor in two shards */
static int check_map(const Checkpoint *ck, const JsonValue *map, const char **names, const char *path) {
    for (size_t i = 0; i < map->count; i++) {
        int s = 0;
        while (strcmp(names[s], map->items[i]->string) != 0) s++;
        if (!st_find(&ck->shards[s], map->keys[i])) {
            lmc_set_error("%s: weight_map puts tensor '%.80s' in %s, which does not hold it", path,
                          map->keys[i], names[s]);
            return -1;
        }
    }
    for (int s = 0; s < ck->n_shards; s++)
        for (int t = 0; t < ck->shards[s].count; t++)
            for (int o = s + 1; o < ck->n_shards; o++)
                if (st_find(&ck->shards[o], ck->shards[s].tensors[t].name)) {
                    lmc_set_error("%s: tensor '%.80s' is in two shards, %s and %s", path,
                                  ck->shards[s].tensors[t].name, names[s], names[o]);
                    return -1;
                }
    return 0;
}

int ckpt_open_index(Checkpoint *ck, const char *dir, const char *text, size_t len, const char *path) {
    memset(ck, 0, sizeof *ck);
    snprintf(ck->path, sizeof ck->path, "%s", path);
    JsonValue *root = json_parse(text, len, path);
    if (!root) return -1;
    int rc = -1;
    const char **names = NULL;
    const JsonValue *map = root->type == JSON_OBJECT ? json_get(root, "weight_map") : NULL;
    if (!map || map->type != JSON_OBJECT || map->count == 0) {
        lmc_set_error("%s: expected an object with a non-empty object 'weight_map'", path);
        goto done;
    }
    int n;
    if (shard_names(map, &names, &n, path)) goto done;
    ck->shards = calloc((size_t)n, sizeof *ck->shards);
    if (!ck->shards) {
        lmc_set_error("out of memory");
        goto done;
    }
    for (int s = 0; s < n; s++) {
        char file[4096];
        snprintf(file, sizeof file, "%s/%s", dir, names[s]);
        if (st_open(&ck->shards[s], file)) goto done;
        ck->n_shards++;
    }
    rc = check_map(ck, map, names, path);
done:
    free(names);
    json_free(root);
    if (rc) ckpt_close(ck);
    return rc;
}

int ckpt_open(Checkpoint *ck, const char *dir) {
    memset(ck, 0, sizeof *ck);
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (stat(path, &sb) == 0) { /* as transformers: the single file wins over an index */
        ck->shards = calloc(1, sizeof *ck->shards);
        if (!ck->shards) {
            lmc_set_error("out of memory");
            return -1;
        }
        snprintf(ck->path, sizeof ck->path, "%s", path);
        if (st_open(ck->shards, path)) {
            ckpt_close(ck);
            return -1;
        }
        ck->n_shards = 1;
        return 0;
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (stat(path, &sb) != 0) {
        lmc_set_error("%s: neither model.safetensors nor model.safetensors.index.json found", dir);
        return -1;
    }
    char *text;
    size_t len;
    if (lmc_read_file(path, &text, &len)) return -1;
    int rc = ckpt_open_index(ck, dir, text, len, path);
    free(text);
    return rc;
}

void ckpt_close(Checkpoint *ck) {
    for (int s = 0; s < ck->n_shards; s++) st_close(&ck->shards[s]);
    free(ck->shards);
    ck->shards = NULL;
    ck->n_shards = 0;
}

const StTensor *ckpt_find(const Checkpoint *ck, const char *name) {
    for (int s = 0; s < ck->n_shards; s++) {
        const StTensor *t = st_find(&ck->shards[s], name);
        if (t) return t;
    }
    return NULL;
}

void ckpt_release(const Checkpoint *ck, const uint8_t *data, size_t nbytes) {
    for (int s = 0; s < ck->n_shards; s++) {
        const SafeTensors *st = &ck->shards[s];
        if (!st->mapped || data < st->map || data + nbytes > st->map + st->map_size) continue;
        /* whole pages inside the range only: a page shared with the next tensor stays */
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
        uintptr_t begin = ((uintptr_t)data + page - 1) & ~(page - 1);
        uintptr_t end = ((uintptr_t)data + nbytes) & ~(page - 1);
        if (end > begin) madvise((void *)begin, end - begin, MADV_DONTNEED);
        return;
    }
}

int ckpt_tensor_file(const Checkpoint *ck, const StTensor *t, int64_t *offset, char *path, size_t path_size) {
    for (int s = 0; s < ck->n_shards; s++) {
        const SafeTensors *st = &ck->shards[s];
        if (t->data < st->map || t->data + t->nbytes > st->map + st->map_size) continue;
        int fd = open(st->path, O_RDONLY | O_CLOEXEC);
        struct stat sb;
        if (fd < 0 || fstat(fd, &sb) != 0 || (size_t)sb.st_size != st->map_size) {
            lmc_set_error("cannot read tensor '%s' from %s: %s", t->name, st->path,
                          fd < 0 ? strerror(errno) : "the file changed while it was loaded");
            if (fd >= 0) close(fd);
            return -1;
        }
        *offset = (int64_t)(t->data - st->map);
        snprintf(path, path_size, "%s", st->path);
        return fd;
    }
    lmc_set_error("%s: tensor '%s' lies in none of its files", ck->path, t->name);
    return -1;
}

int ckpt_count(const Checkpoint *ck) {
    int n = 0;
    for (int s = 0; s < ck->n_shards; s++) n += ck->shards[s].count;
    return n;
}
