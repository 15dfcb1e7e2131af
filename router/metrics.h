/* router/metrics.h - private to router/: the Prometheus text of GET /metrics (metrics.c). */
#ifndef ROUTER_METRICS_H
#define ROUTER_METRICS_H

#include "serve_impl.h"

/* Collects the router's counters and asks the executor and every fetcher of the run directory
 * for their health and counters (each with a short timeout; one that does not answer is
 * reported down), then renders the Prometheus text exposition (format 0.0.4). Returns a
 * malloc'd NUL-terminated string, NULL when out of memory. */
char *router_metrics_text(struct router_serve *s);

#endif /* ROUTER_METRICS_H */
