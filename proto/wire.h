/* proto/wire.h - control messages over nng: a request/reply server and a client call. */
#ifndef PROTO_WIRE_H
#define PROTO_WIRE_H

#include <stdbool.h>
#include <stdint.h>

#include "common.h"
#include "proto.h"

/* URLs are nng's: "ipc:///run/dir/router.sock" (the socket file is created with mode 0600) or
 * "tcp://host:port". */

/* ---- server: rep0 with several contexts ----------------------------------------------------- */

/* Called once per verified inbound message, from one of the server's worker contexts (several
 * may run at once: the handler must be thread-safe). Fill *rep (its request_id defaults to the
 * request's) and return 0 to send it; a handler may block (a long poll) up to the server's
 * `max_block_ms`. Returning a negative common_err sends an ERROR reply with that code and
 * rep->u.error.message if set. The request is cleared (proto_msg_clear) after the call; the
 * reply too, after it was sent, so a handler may hand over malloc'd text in it. */
typedef int (*proto_handler_fn)(void *arg, const struct proto_msg *req, struct proto_msg *rep);

struct proto_server_opts {
    uint32_t n_workers; /* requests served at once (contexts); 0 = 4 */
    uint32_t recv_max;  /* largest inbound message; 0 = PROTO_MAX_MESSAGE_BYTES */
};

struct proto_server;

/* Listens on `url` (for ipc://, the socket file gets mode 0600 and a stale file left by a dead
 * process is replaced) and serves it with `handler` on nng's threads. Malformed, oversized or
 * unverifiable requests get an ERROR reply (COMMON_EPROTO) without reaching the handler; the
 * server carries on. Returns 0, COMMON_EBUSY (another live server listens there),
 * COMMON_EIO (nng failure, named in e), COMMON_ENOMEM. */
int proto_server_start(const char *url, const struct proto_server_opts *o, proto_handler_fn handler,
                       void *arg, struct proto_server **out, struct common_errmsg *e);
/* Stops listening, waits for handlers in flight, frees; accepts NULL. */
void proto_server_stop(struct proto_server *s);
/* Counters: requests served, malformed requests refused. */
void proto_server_counts(const struct proto_server *s, uint64_t *served, uint64_t *refused);
/* Listeners replaced by the server's watchdog (ipc:// only). nng 1.5.2 stops accepting on a
 * listener whose peer disconnects during the SP handshake (nanomsg/nng#1518); the server checks
 * its listener every 500 ms and replaces a broken one within about a second. Replacing it closes
 * the connections accepted through it: calls in flight on them fail with COMMON_ECLOSED, and nng
 * reconnects the clients. 0 for NULL. */
uint64_t proto_server_listener_restarts(const struct proto_server *s);

/* ---- client: req0 --------------------------------------------------------------------------- */

struct proto_client;

/* Dials `url` (nng reconnects in the background). Returns 0, COMMON_EIO with a message. Does not
 * wait for the peer: the first call does. */
int  proto_client_open(const char *url, struct proto_client **out, struct common_errmsg *e);
void proto_client_close(struct proto_client *c);
/* Replaces the client's socket with a fresh one dialing the same url (calls in flight on the old
 * one fail). For a peer that stopped answering: once, under load, an executor got no reply from
 * a restarted fetcher for 30 s while that fetcher's listener accepted new connections (its
 * watchdog probes passed), i.e. the client's dialer was stuck; so callers waiting for a restarted
 * server start over with a new dialer after a call times out. Returns 0 or COMMON_EIO /
 * COMMON_ENOMEM (the old socket is kept). Not thread-safe against calls on the same client. */
int proto_client_reopen(struct proto_client *c, struct common_errmsg *e);

/* Sends `req` and waits up to `timeout_ms` for the reply, decoded into *rep (release it with
 * proto_msg_clear). An ERROR reply is returned as 0 with rep->kind == PROTO_KIND_ERROR. Returns
 * 0, COMMON_ETIMEDOUT (no reply in time: the peer is gone, busy or not started; e says which
 * url), COMMON_EPROTO (the reply did not verify), COMMON_EIO, COMMON_ENOMEM. Thread-safe: calls
 * from several threads each get their own nng context. */
int proto_client_call(struct proto_client *c, const struct proto_msg *req, struct proto_msg *rep,
                      int timeout_ms, struct common_errmsg *e);

/* One-shot: open, call, close. */
int proto_call(const char *url, const struct proto_msg *req, struct proto_msg *rep, int timeout_ms,
               struct common_errmsg *e);

#endif /* PROTO_WIRE_H */
