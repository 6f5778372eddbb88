/* json.h — a small, strict JSON parser (RFC 8259) for config.json and safetensors headers.
 *
 * The whole document becomes a tree of JsonValue. Inputs are untrusted (the fuzz target feeds
 * arbitrary bytes), so the parser checks every bound, limits nesting depth and never reads
 * past the given length. */
#ifndef LMC_JSON_H
#define LMC_JSON_H

#include <stddef.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;

typedef struct JsonValue JsonValue;
struct JsonValue {
    JsonType type;
    int boolean;
    double number;
    char *string;      /* JSON_STRING: decoded, NUL-terminated (embedded NULs rejected) */
    size_t count;      /* JSON_ARRAY / JSON_OBJECT: number of items */
    char **keys;       /* JSON_OBJECT: item names */
    JsonValue **items; /* JSON_ARRAY / JSON_OBJECT: items */
};

/* Parse text[0..len). Returns NULL and records an error mentioning `what` on failure. */
JsonValue *json_parse(const char *text, size_t len, const char *what);
void json_free(JsonValue *v);

/* object member by name (first match) or NULL */
const JsonValue *json_get(const JsonValue *obj, const char *key);
const char *json_type_name(JsonType t);

#include <stdio.h>
/* write s as a JSON string literal (quoted, escaped) */
void json_write_string(FILE *f, const char *s);

#endif
