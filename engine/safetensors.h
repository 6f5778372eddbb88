/* safetensors.h — reading a .safetensors file: mmap, header validation, tensor lookup.
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON header
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
 * then the data; offsets are relative to the start of the data (byte 8 + N). */
#ifndef LMC_SAFETENSORS_H
#define LMC_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#define ST_MAX_DIMS 8
/* a header above this is not a model header (the largest real ones are a few MB) */
#define ST_MAX_HEADER ((uint64_t)100 << 20)

typedef enum { ST_F64, ST_F32, ST_F16, ST_BF16, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL } StDtype;

typedef struct {
    char *name;
    StDtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const uint8_t *data; /* inside the mapping */
    size_t nbytes;
} StTensor;

typedef struct {
    const uint8_t *map; /* whole file */
    size_t map_size;
    int mapped;         /* 1: map came from mmap and is unmapped by st_close */
    struct stat opened; /* the file as mapped (fstat at open): checkpoint.c tells a changed file by it */
    StTensor *tensors;
    int count;
    int *by_name; /* [count] indices into tensors, sorted by name: st_find is a binary search */
    char path[512];
} SafeTensors;

/* Parse an in-memory file image (not copied; must outlive st). -1 + error on failure. */
int st_parse(SafeTensors *st, const uint8_t *data, size_t size, const char *path);
/* mmap `path` (a regular file; opened non-blocking, so a FIFO is refused, not waited on) and parse it */
int st_open(SafeTensors *st, const char *path);
void st_close(SafeTensors *st);

const StTensor *st_find(const SafeTensors *st, const char *name);
const char *st_dtype_name(StDtype d);
size_t st_dtype_size(StDtype d);

/* Convert a F32/BF16/F16 tensor's elements to float; -1 + error for other dtypes. */
int st_to_f32(const StTensor *t, float *out, size_t count);

float lmc_bf16_to_f32(uint16_t h);
float lmc_f16_to_f32(uint16_t h);

#endif
