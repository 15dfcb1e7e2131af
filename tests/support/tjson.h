/* tests/support/tjson.h - a minimal JSON reader for tests that read fixture reference files. */
#ifndef TESTS_SUPPORT_TJSON_H
#define TESTS_SUPPORT_TJSON_H

#include <stddef.h>

enum tjson_kind { TJSON_NULL, TJSON_BOOL, TJSON_NUM, TJSON_STR, TJSON_ARR, TJSON_OBJ };

/* One parsed value; objects keep their keys in `keys` beside `items`. */
struct tjson {
    enum tjson_kind kind;
    double          num;   /* TJSON_NUM, TJSON_BOOL (0/1) */
    char           *str;   /* owned: TJSON_STR, NUL-terminated UTF-8 */
    size_t          len;   /* string bytes, or items of an array/object */
    struct tjson  **items; /* owned: array elements or object values */
    char          **keys;  /* owned: object keys */
};

/* Parses `text`; returns NULL on malformed input. Free with tjson_free(). */
struct tjson *tjson_parse(const char *text);
void          tjson_free(struct tjson *v);

/* Object member `key`, or NULL (also when v is not an object). */
const struct tjson *tjson_get(const struct tjson *v, const char *key);
/* Array element i, or NULL. */
const struct tjson *tjson_at(const struct tjson *v, size_t i);

/* Reads a fixture JSON file; returns NULL when missing or malformed. */
struct tjson *tjson_load(const char *path);

#endif /* TESTS_SUPPORT_TJSON_H */
