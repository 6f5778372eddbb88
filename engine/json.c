/* json.c — see json.h */
#include "json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define JSON_MAX_DEPTH 64

typedef struct {
    const char *s;
    size_t len, pos;
    const char *what;
    int failed;
} Parser;

static void fail(Parser *p, const char *msg) {
    if (!p->failed) lmc_set_error("%s: invalid JSON at byte %zu: %s", p->what, p->pos, msg);
    p->failed = 1;
}

static void skip_ws(Parser *p) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static JsonValue *new_value(Parser *p, JsonType t) {
    JsonValue *v = calloc(1, sizeof *v);
    if (!v) fail(p, "out of memory");
    else v->type = t;
    return v;
}

void json_free(JsonValue *v) {
    if (!v) return;
    free(v->string);
    for (size_t i = 0; i < v->count; i++) {
        if (v->keys) free(v->keys[i]);
        if (v->items) json_free(v->items[i]);
    }
    free(v->keys);
    free(v->items);
    free(v);
}

static int hex4(Parser *p, unsigned *out) {
    if (p->len - p->pos < 4) {
        fail(p, "truncated \\u escape");
        return -1;
    }
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->s[p->pos++];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else {
            fail(p, "bad hex digit in \\u escape");
            return -1;
        }
    }
    *out = v;
    return 0;
}

/* Decode a string starting after the opening quote. The decoded text is never longer than
 * the raw text, so one buffer of the raw length suffices. */
static char *parse_string(Parser *p) {
    size_t start = p->pos;
    size_t end = start;
    while (end < p->len && p->s[end] != '"') {
        if (p->s[end] == '\\') end++;
        end++;
    }
    if (end >= p->len) {
        fail(p, "unterminated string");
        return NULL;
    }
    char *out = malloc(end - start + 1);
    if (!out) {
        fail(p, "out of memory");
        return NULL;
    }
    size_t n = 0;
    while (p->pos < end) {
        unsigned char c = (unsigned char)p->s[p->pos++];
        if (c < 0x20) {
            fail(p, "control character in string");
            break;
        }
        if (c != '\\') {
            out[n++] = (char)c;
            continue;
        }
        char e = p->s[p->pos++];
        switch (e) {
        case '"': out[n++] = '"'; break;
        case '\\': out[n++] = '\\'; break;
        case '/': out[n++] = '/'; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u': {
            unsigned cp;
            if (hex4(p, &cp) != 0) break;
            if (cp == 0) {
                fail(p, "\\u0000 in string");
                break;
            }
            /* surrogate pairs are kept as two 3-byte sequences: names here are ASCII, and
             * the 6 raw bytes of "\uXXXX" always have room for the 3 encoded ones */
            if (cp < 0x80) out[n++] = (char)cp;
            else if (cp < 0x800) {
                out[n++] = (char)(0xC0 | (cp >> 6));
                out[n++] = (char)(0x80 | (cp & 0x3F));
            } else {
                out[n++] = (char)(0xE0 | (cp >> 12));
                out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                out[n++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: fail(p, "bad escape in string"); break;
        }
        if (p->failed) break;
    }
    if (p->failed) {
        free(out);
        return NULL;
    }
    out[n] = '\0';
    p->pos = end + 1;
    return out;
}

static void parse_number(Parser *p, JsonValue *v) {
    size_t start = p->pos;
    if (p->pos < p->len && p->s[p->pos] == '-') p->pos++;
    size_t digits = p->pos;
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    if (p->pos == digits) {
        fail(p, "bad number");
        return;
    }
    if (p->pos < p->len && p->s[p->pos] == '.') {
        p->pos++;
        size_t frac = p->pos;
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
        if (p->pos == frac) {
            fail(p, "bad number fraction");
            return;
        }
    }
    if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        p->pos++;
        if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
        size_t ex = p->pos;
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
        if (p->pos == ex) {
            fail(p, "bad number exponent");
            return;
        }
    }
    /* strtod needs a NUL-terminated copy: the input buffer may end right after the number */
    size_t n = p->pos - start;
    char buf[64];
    if (n >= sizeof buf) {
        fail(p, "number too long");
        return;
    }
    memcpy(buf, p->s + start, n);
    buf[n] = '\0';
    v->number = strtod(buf, NULL);
    if (!isfinite(v->number)) fail(p, "number out of range");
}

static int match_word(Parser *p, const char *word) {
    size_t n = strlen(word);
    if (p->len - p->pos >= n && memcmp(p->s + p->pos, word, n) == 0) {
        p->pos += n;
        return 1;
    }
    return 0;
}

static int push_item(Parser *p, JsonValue *parent, size_t *cap, char *key, JsonValue *item) {
    if (parent->count == *cap) {
        size_t ncap = *cap ? *cap * 2 : 4;
        JsonValue **items = realloc(parent->items, ncap * sizeof *items);
        if (!items) goto oom;
        parent->items = items;
        if (parent->type == JSON_OBJECT) {
            char **keys = realloc(parent->keys, ncap * sizeof *keys);
            if (!keys) goto oom;
            parent->keys = keys;
        }
        *cap = ncap;
    }
    parent->items[parent->count] = item;
    if (parent->type == JSON_OBJECT) parent->keys[parent->count] = key;
    parent->count++;
    return 0;
oom:
    fail(p, "out of memory");
    free(key);
    json_free(item);
    return -1;
}

static JsonValue *parse_value(Parser *p, int depth) {
    if (depth > JSON_MAX_DEPTH) {
        fail(p, "nesting too deep");
        return NULL;
    }
    skip_ws(p);
    if (p->pos >= p->len) {
        fail(p, "unexpected end of input");
        return NULL;
    }
    char c = p->s[p->pos];
    JsonValue *v = NULL;
    if (c == '{' || c == '[') {
        int is_obj = c == '{';
        char close = is_obj ? '}' : ']';
        v = new_value(p, is_obj ? JSON_OBJECT : JSON_ARRAY);
        if (!v) return NULL;
        p->pos++;
        size_t cap = 0;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == close) {
            p->pos++;
            return v;
        }
        for (;;) {
            char *key = NULL;
            if (is_obj) {
                skip_ws(p);
                if (p->pos >= p->len || p->s[p->pos] != '"') {
                    fail(p, "expected a string key");
                    break;
                }
                p->pos++;
                key = parse_string(p);
                if (!key) break;
                skip_ws(p);
                if (p->pos >= p->len || p->s[p->pos] != ':') {
                    free(key);
                    fail(p, "expected ':'");
                    break;
                }
                p->pos++;
            }
            JsonValue *item = parse_value(p, depth + 1);
            if (!item) {
                free(key);
                break;
            }
            if (push_item(p, v, &cap, key, item) != 0) break;
            skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == ',') {
                p->pos++;
                continue;
            }
            if (p->pos < p->len && p->s[p->pos] == close) {
                p->pos++;
                return v;
            }
            fail(p, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
            break;
        }
        json_free(v);
        return NULL;
    }
    if (c == '"') {
        p->pos++;
        char *s = parse_string(p);
        if (!s) return NULL;
        v = new_value(p, JSON_STRING);
        if (!v) {
            free(s);
            return NULL;
        }
        v->string = s;
        return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        v = new_value(p, JSON_NUMBER);
        if (!v) return NULL;
        parse_number(p, v);
        if (p->failed) {
            json_free(v);
            return NULL;
        }
        return v;
    }
    int is_true = match_word(p, "true");
    if (is_true || match_word(p, "false")) {
        v = new_value(p, JSON_BOOL);
        if (v) v->boolean = is_true;
        return v;
    }
    if (match_word(p, "null")) return new_value(p, JSON_NULL);
    fail(p, "unexpected character");
    return NULL;
}

JsonValue *json_parse(const char *text, size_t len, const char *what) {
    Parser p = {text, len, 0, what, 0};
    JsonValue *v = parse_value(&p, 0);
    if (!v) return NULL;
    skip_ws(&p);
    if (p.pos != p.len) {
        fail(&p, "trailing characters after the document");
        json_free(v);
        return NULL;
    }
    return v;
}

const JsonValue *json_get(const JsonValue *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT) return NULL;
    for (size_t i = 0; i < obj->count; i++)
        if (strcmp(obj->keys[i], key) == 0) return obj->items[i];
    return NULL;
}

const char *json_type_name(JsonType t) {
    switch (t) {
    case JSON_NULL: return "null";
    case JSON_BOOL: return "boolean";
    case JSON_NUMBER: return "number";
    case JSON_STRING: return "string";
    case JSON_ARRAY: return "array";
    case JSON_OBJECT: return "object";
    }
    return "?";
}

void json_write_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
        else if (*c < 0x20) fprintf(f, "\\u%04x", *c);
        else fputc(*c, f);
    }
    fputc('"', f);
}
