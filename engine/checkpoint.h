/* checkpoint.h — a model's tensors: one model.safetensors, or the shards that
 * model.safetensors.index.json names, looked up by tensor name across all of them. */
#ifndef LMC_CHECKPOINT_H
#define LMC_CHECKPOINT_H

#include "safetensors.h"

/* more shards than any published checkpoint has (the largest have a few hundred) */
#define CKPT_MAX_SHARDS 4096

typedef struct {
    SafeTensors *shards;
    int n_shards;
    char path[512]; /* the file that named the tensors: model.safetensors or the index */
} Checkpoint;

/* Open DIR/model.safetensors if it exists, else DIR/model.safetensors.index.json and every
 * shard its weight_map names (plain file names in DIR). Checks that each mapped tensor is in
 * its shard and that no tensor is in two shards. -1 + error naming the file on failure. */
int ckpt_open(Checkpoint *ck, const char *dir);
/* Parse index.json text and open its shards from dir (ckpt_open's second half). */
int ckpt_open_index(Checkpoint *ck, const char *dir, const char *text, size_t len, const char *path);
void ckpt_close(Checkpoint *ck);

const StTensor *ckpt_find(const Checkpoint *ck, const char *name);
/* Give back the mapped file pages of [data, data + nbytes) once they are converted: a read-only
 * private file mapping re-reads them from the file if they are touched again, so this only
 * keeps the loader's resident set at the converted weights plus one chunk of the file. Data
 * outside every mapping (a parsed in-memory image) is left alone. */
void ckpt_release(const Checkpoint *ck, const uint8_t *data, size_t nbytes);
/* The loader reads ck's mappings between these two calls. A file of ck truncated meanwhile (a
 * model re-exported in place while lmc starts) makes a read of a mapped page past its new end a
 * SIGBUS: between the calls, that one signal prints "lmc: error: FILE changed while it was being
 * read (...)" and exits LMC_EXIT_INPUT instead of dying of "Bus error" (it exits, as no parser
 * may: there is no returning from the fault). Any other SIGBUS kills lmc as before,
 * and ckpt_read_end restores the disposition ckpt_read_begin found. ckpt_read_end then compares
 * each file's stat (device, inode, size, mtime) with its fstat at open: -1 + the same error when
 * one changed, since the bytes read may mix two versions of it. */
void ckpt_read_begin(const Checkpoint *ck);
int ckpt_read_end(const Checkpoint *ck);
/* The file that holds t (a tensor of ck), opened again for reading (O_CLOEXEC), with its path
 * (into path[path_size]) and where t's data starts in it (*offset): for reading t with pread
 * once ck is closed. -1 + error naming the file when it cannot be opened or is no longer the
 * file mapped (ckpt_read_end's test). */
int ckpt_tensor_file(const Checkpoint *ck, const StTensor *t, int64_t *offset, char *path, size_t path_size);
/* tensors in all shards */
int ckpt_count(const Checkpoint *ck);

#endif
