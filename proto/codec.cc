/* proto/codec.cc - the C API over the flatc-generated C++ code: encode, verify, decode. */
#include <cstdlib>
#include <cstring>
#include <new>

#include "sluice_generated.h"

extern "C" {
#include "common.h"
#include "proto.h"
}

namespace fb = flatbuffers;
namespace sp = sluice::proto;

/* Copies a flatbuffers string into a fixed C buffer; false when it does not fit or holds NUL. */
static bool codec_copy_str(const fb::String *s, char *dst, size_t cap)
{
    if (!s) {
        dst[0] = '\0';
        return true;
    }
    if (s->size() >= cap || std::memchr(s->data(), '\0', s->size()))
        return false;
    std::memcpy(dst, s->data(), s->size());
    dst[s->size()] = '\0';
    return true;
}

/* Reads a C enum field as an int: C callers may store any value in it, and loading an
 * out-of-range value through the C++ enum type is undefined behaviour. */
template <typename E> static int codec_enum(const E *field)
{
    static_assert(sizeof(E) == sizeof(int), "C enums are int-sized here");
    int v;
    std::memcpy(&v, field, sizeof(v));
    return v;
}

static bool codec_str_fits(const char *s, size_t cap)
{
    return std::memchr(s, '\0', cap) != nullptr;
}

extern "C" int proto_encode(const struct proto_msg *m, uint8_t **buf, size_t *len)
{
    try {
        fb::FlatBufferBuilder b(256);
        fb::Offset<void>      body;
        sp::Body              type;
        switch (codec_enum(&m->kind)) {
        case PROTO_KIND_HELLO: {
            const struct proto_hello *h = &m->u.hello;
            int role = codec_enum(&h->role);
            if (h->n_shards > PROTO_MAX_SHARDS || !codec_str_fits(h->name, sizeof(h->name)) ||
                role < PROTO_ROLE_FETCHER || role > PROTO_ROLE_CLIENT)
                return COMMON_EINVAL;
            std::vector<fb::Offset<sp::Shard>> shards;
            for (uint32_t i = 0; i < h->n_shards; i++)
                shards.push_back(sp::CreateShard(b, h->shards[i].fetcher, h->shards[i].first_expert,
                                                 h->shards[i].n_experts));
            auto name = b.CreateString(h->name);
            auto vec  = b.CreateVector(shards);
            body = sp::CreateHello(b, h->major, h->minor, static_cast<sp::Role>(role), name, vec)
                       .Union();
            type = sp::Body_Hello;
            break;
        }
        case PROTO_KIND_ERROR: {
            const struct proto_error *e = &m->u.error;
            if (!codec_str_fits(e->message, sizeof(e->message)))
                return COMMON_EINVAL;
            auto msg = b.CreateString(e->message);
            body     = sp::CreateError(b, e->code, msg).Union();
            type     = sp::Body_Error;
            break;
        }
        default:
            return COMMON_EINVAL;
        }
        b.Finish(sp::CreateEnvelope(b, m->request_id, type, body), sp::EnvelopeIdentifier());
        uint8_t *out = static_cast<uint8_t *>(std::malloc(b.GetSize()));
        if (!out)
            return COMMON_ENOMEM;
        std::memcpy(out, b.GetBufferPointer(), b.GetSize());
        *buf = out;
        *len = b.GetSize();
        return COMMON_OK;
    } catch (const std::bad_alloc &) {
        return COMMON_ENOMEM;
    }
}

extern "C" int proto_decode(const void *buf, size_t len, struct proto_msg *out)
{
    if (!buf || len < 8 || len > PROTO_MAX_MESSAGE_BYTES)
        return COMMON_EPROTO;
    const uint8_t *p = static_cast<const uint8_t *>(buf);
    /* Depth and table limits keep a hostile message from costing much to verify. */
    fb::Verifier v(p, len, 16, 4096);
    if (!sp::EnvelopeBufferHasIdentifier(p) || !sp::VerifyEnvelopeBuffer(v))
        return COMMON_EPROTO;
    const sp::Envelope *env = sp::GetEnvelope(p);
    struct proto_msg    m;
    std::memset(&m, 0, sizeof(m));
    m.request_id = env->request_id();
    switch (env->body_type()) {
    case sp::Body_Hello: {
        const sp::Hello *h = env->body_as_Hello();
        if (!h || (unsigned)h->role() > PROTO_ROLE_CLIENT)
            return COMMON_EPROTO;
        m.kind          = PROTO_KIND_HELLO;
        m.u.hello.major = h->major();
        m.u.hello.minor = h->minor();
        m.u.hello.role  = static_cast<enum proto_role>(h->role());
        if (!codec_copy_str(h->name(), m.u.hello.name, sizeof(m.u.hello.name)))
            return COMMON_EPROTO;
        if (h->shards()) {
            if (h->shards()->size() > PROTO_MAX_SHARDS)
                return COMMON_EPROTO;
            for (const sp::Shard *s : *h->shards()) {
                if (!s)
                    return COMMON_EPROTO;
                m.u.hello.shards[m.u.hello.n_shards++] = {s->fetcher(), s->first_expert(),
                                                          s->n_experts()};
            }
        }
        break;
    }
    case sp::Body_Error: {
        const sp::Error *e = env->body_as_Error();
        if (!e)
            return COMMON_EPROTO;
        m.kind         = PROTO_KIND_ERROR;
        m.u.error.code = e->code();
        if (!codec_copy_str(e->message(), m.u.error.message, sizeof(m.u.error.message)))
            return COMMON_EPROTO;
        break;
    }
    default:
        return COMMON_EPROTO;
    }
    *out = m;
    return COMMON_OK;
}
