/* checkpoint.c — see checkpoint.h.
 *
 * The index is {"metadata": {...}, "weight_map": {"tensor name": "shard file name", ...}}.
 * Shard names are refused unless they are plain file names: an index must not make lmc open
 * files outside the model directory. */
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
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

/* A file rewritten in place while it is read mixes two versions in what was read; one truncated
 * makes a read of a mapped page past its new end a SIGBUS. The same words for both: */
#define CHANGED " changed while it was being read (truncated or rewritten in place?); " \
                "load it again once it is complete"

/* the same file, unchanged as far as its inode tells: a rewrite in place changes the mtime (and
 * mostly the size), a replacement by rename the inode */
static int same_file(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* The checkpoint whose mappings are being read, for the SIGBUS handler; the handler only reads
 * it (its paths were stored at open) and calls write(2), pause, sigaction, raise and _exit, all
 * async-signal-safe, besides a lock-free atomic flag: the pool's threads may fault at once, and
 * one of them reports while the others wait for its _exit. */
static const Checkpoint *reading;
static struct sigaction before_reading;
static atomic_flag reported = ATOMIC_FLAG_INIT;

/* strcpy at line + n, returning the new length (no libc call: this runs in the handler) */
static size_t append(char *line, size_t n, const char *s) {
    while (*s) line[n++] = *s++;
    return n;
}

static void on_sigbus(int sig, siginfo_t *info, void *context) {
    const uint8_t *at = info->si_addr;
    for (int s = 0; info->si_code == BUS_ADRERR && s < reading->n_shards; s++) {
        const SafeTensors *st = &reading->shards[s];
        if (!st->mapped || at < st->map || at >= st->map + st->map_size) continue;
        while (atomic_flag_test_and_set(&reported)) pause();
        char line[sizeof "lmc: error: " + sizeof st->path + sizeof CHANGED];
        size_t n = append(line, 0, "lmc: error: ");
        n = append(line, n, st->path);
        n = append(line, n, CHANGED "\n");
        ssize_t written = write(STDERR_FILENO, line, n);
        (void)written; /* nothing better to do if stderr is gone */
        _exit(LMC_EXIT_INPUT);
    }
    /* not a page of the checkpoint (or sent by kill): die of it as without this handler */
    sigaction(SIGBUS, &before_reading, NULL);
    raise(sig);
}

void ckpt_read_begin(const Checkpoint *ck) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    atomic_flag_clear(&reported);
    reading = ck;
    sigaction(SIGBUS, &sa, &before_reading);
}

int ckpt_read_end(const Checkpoint *ck) {
    sigaction(SIGBUS, &before_reading, NULL);
    reading = NULL;
    for (int s = 0; s < ck->n_shards; s++) {
        const SafeTensors *st = &ck->shards[s];
        struct stat now;
        if (st->mapped && (stat(st->path, &now) != 0 || !same_file(&now, &st->opened))) {
            lmc_set_error("%s" CHANGED, st->path);
            return -1;
        }
    }
    return 0;
}

int ckpt_tensor_file(const Checkpoint *ck, const StTensor *t, int64_t *offset, char *path, size_t path_size) {
    for (int s = 0; s < ck->n_shards; s++) {
        const SafeTensors *st = &ck->shards[s];
        if (t->data < st->map || t->data + t->nbytes > st->map + st->map_size) continue;
        int fd = open(st->path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            lmc_set_error("cannot read tensor '%s' from %s: %s", t->name, st->path, strerror(errno));
            return -1;
        }
        struct stat sb;
        if (fstat(fd, &sb) != 0 || !same_file(&sb, &st->opened)) {
            lmc_set_error("%s" CHANGED, st->path);
            close(fd);
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
