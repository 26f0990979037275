"""The simulator's compiled event loop: dynamic batching over one control tick.

One call advances one simulated pool from `t_start` to `t_end` under one batch config,
consuming that tick's arrivals. It implements the rule of `adaptive.batcher` (and
docs/batching.md) batch-at-a-time:

    next dispatch of queue q = max(earliest free worker of q,
                                   arrival of its max_batch-th queued request   if that many wait,
                                   oldest queued arrival + timeout              otherwise,
                                   t_start)

With an overhead distribution (`overhead_s`: its inverse CDF on an even grid of
probabilities), each completed request also gets a client latency: its worker latency
plus one draw of the overhead, into a second histogram and SLO count.

Arrivals at or before that instant join the queue first (so a request arriving exactly
at a dispatch instant is in the batch). A dispatch that would fall at or after `t_end`
is left for the next call, which may run a new config: that is how a config change
takes effect at the next batch formation without touching the queue.

State lives in arrays owned by `simulations.engine.PoolState`, so the loop keeps no
Python objects and numba compiles it to a tight loop (about 20-40 ns a request).
"""

import math

import numpy as np
from numba import njit

ROUTE_SHARED = 0
ROUTE_ROUND_ROBIN = 1
ROUTE_SHORTEST_QUEUE = 2

# Indices into the per-tick statistics vector.
(
    ST_ARRIVALS,
    ST_SHED,
    ST_COMPLETED,
    ST_BATCHES,
    ST_BATCH_SIZE_SUM,
    ST_FILL_SUM,
    ST_BUSY_S,
    ST_LATENCY_SUM_S,
    ST_LATENCY_MAX_S,
    ST_WITHIN_SLO,
    ST_MAX_QUEUE_DEPTH,
    ST_QUEUE_DEPTH_END,
    ST_P50_S,
    ST_P99_S,
    ST_CLIENT_WITHIN_SLO,
    ST_CLIENT_LATENCY_SUM_S,
    ST_CLIENT_P50_S,
    ST_CLIENT_P99_S,
) = range(18)
NUM_STATS = 18

# Indices into the integer state vector.
IS_ROUND_ROBIN, IS_BATCHES, IS_NORMAL_POS, IS_RECORDS, IS_NEXT_ID, IS_UNIFORM_POS = range(6)
NUM_INT_STATE = 6

# Columns of the optional per-request record (tests and parity checks).
# REC_OVERHEAD: the time outside the batcher drawn for the client account (0 without).
(
    REC_ID,
    REC_ARRIVED_AT,
    REC_DISPATCHED_AT,
    REC_COMPLETED_AT,
    REC_WORKER,
    REC_BATCH,
    REC_OVERHEAD,
) = range(7)
NUM_REC_COLUMNS = 7

HIST_TICK = 0
HIST_CLIENT = 1  # the tick's client account, when the pool adds an overhead


@njit(cache=True, inline="always")
def _dispatch_time(queued, max_batch, head_at, full_at, timeout_s, free_at, t_start):
    """When a queue's next batch goes: the rule in the module docstring, on scalars.

    `full_at` is the arrival of the max_batch-th queued request (ignored if fewer wait).
    Helpers here take scalars only: passing arrays into a call costs refcount updates
    that, per request, would double the loop's time.
    """
    if queued == 0:
        return math.inf
    ready = full_at if queued >= max_batch else head_at + timeout_s
    return max(free_at, ready, t_start)


@njit(cache=True, inline="always")
def _route(t, routing, qlen, worker_free, istate):
    if routing == ROUTE_SHARED:
        return 0
    num = qlen.shape[0]
    if routing == ROUTE_ROUND_ROBIN:
        q = istate[IS_ROUND_ROBIN] % num
        istate[IS_ROUND_ROBIN] += 1
        return q
    best = 0
    best_load = qlen[0] + (1 if worker_free[0] > t else 0)
    for q in range(1, num):
        load = qlen[q] + (1 if worker_free[q] > t else 0)
        if load < best_load:
            best, best_load = q, load
    return best


@njit(cache=True, inline="always")
def _bucket_guess(latency_s, min_value_s, inv_log_gamma, num_buckets):
    """The bucket by logarithm; `_settle` makes it exact against the bucket bounds."""
    if latency_s < min_value_s:
        return 0
    return min(num_buckets - 1, 1 + int(math.log(latency_s / min_value_s) * inv_log_gamma))


@njit(cache=True, inline="always")
def _bucket_of(latency_s, min_value_s, inv_log_gamma, bucket_lower):
    """The exact bucket of one latency: the guess, settled against the bounds."""
    num_buckets = bucket_lower.shape[0]
    b = _bucket_guess(latency_s, min_value_s, inv_log_gamma, num_buckets)
    while b + 1 < num_buckets and latency_s >= bucket_lower[b + 1]:
        b += 1
    while b > 0 and latency_s < bucket_lower[b]:
        b -= 1
    return b


@njit(cache=True, inline="always")
def _overhead_draw(u, overhead_s):
    """The overhead at probability `u`, from its inverse CDF on an even grid."""
    x = u * (overhead_s.shape[0] - 1)
    lo = min(int(x), overhead_s.shape[0] - 2)
    return overhead_s[lo] + (x - lo) * (overhead_s[lo + 1] - overhead_s[lo])


@njit(cache=True)
def _quantile(counts, q, representatives):
    total = 0
    for k in range(counts.shape[0]):
        total += counts[k]
    if total == 0:
        return math.nan
    rank = max(1, math.ceil(q * total))
    seen = 0
    for k in range(counts.shape[0]):
        seen += counts[k]
        if seen >= rank:
            return representatives[k]
    return representatives[counts.shape[0] - 1]


@njit(cache=True, nogil=True)
def run_tick(
    t_start,
    t_end,
    arrivals,
    max_batch,
    timeout_s,
    max_queue,
    routing,
    service_mean_s,
    service_sigma,
    normals,
    slo_s,
    qtime,
    qid,
    qhead,
    qlen,
    worker_free,
    istate,
    stats,
    hists,
    hist_params,
    bucket_lower,
    representatives,
    records,
    overhead_s,
    uniforms,
):
    """Advance the pool to `t_end`; see the module docstring for the rule.

    `max_queue` < 0 means unbounded. `records` with zero rows disables per-request logs.
    `hists` row HIST_TICK receives this tick's latency histogram (bucket layout of
    adaptive.histogram), and row HIST_CLIENT the client account's when `overhead_s` is
    not empty (one of `uniforms` drawn per completed request). The queue capacity
    (qtime.shape[1]) must be a power of two.
    """
    min_value_s, inv_log_gamma = hist_params[0], hist_params[1]
    num_buckets = hists.shape[1]
    mask = qtime.shape[1] - 1  # capacity is a power of two
    num_queues = qlen.shape[0]
    num_workers = worker_free.shape[0]
    record = records.shape[0] > 0
    client = overhead_s.shape[0] > 1
    stats[:] = 0.0
    hists[:, :] = 0

    free_min = math.inf
    free_worker = 0
    for w in range(num_workers):
        if worker_free[w] < free_min:
            free_min, free_worker = worker_free[w], w
    cand = np.empty(num_queues)
    for q in range(num_queues):
        cand[q] = _dispatch_time(
            qlen[q],
            max_batch,
            qtime[q, qhead[q]],
            qtime[q, (qhead[q] + max_batch - 1) & mask],
            timeout_s,
            free_min if routing == ROUTE_SHARED else worker_free[q],
            t_start,
        )
    depth = 0
    for q in range(num_queues):
        depth += qlen[q]
    max_depth = depth

    i = 0
    n = arrivals.shape[0]
    while True:
        best_q = 0
        for q in range(1, num_queues):
            if cand[q] < cand[best_q]:
                best_q = q
        best_d = cand[best_q]

        if i < n and arrivals[i] <= best_d:
            t = arrivals[i]
            # Calls that take arrays cost refcount traffic; the shared queue needs none.
            q = 0 if routing == ROUTE_SHARED else _route(t, routing, qlen, worker_free, istate)
            request_id = istate[IS_NEXT_ID]
            istate[IS_NEXT_ID] += 1
            stats[ST_ARRIVALS] += 1
            i += 1
            if max_queue >= 0 and qlen[q] >= max_queue:
                stats[ST_SHED] += 1
                if record:
                    r = istate[IS_RECORDS]
                    istate[IS_RECORDS] += 1
                    records[r, REC_ID] = request_id
                    records[r, REC_ARRIVED_AT] = t
                    records[r, REC_DISPATCHED_AT] = math.nan
                    records[r, REC_COMPLETED_AT] = math.nan
                    records[r, REC_WORKER] = -1
                    records[r, REC_BATCH] = -1
                    records[r, REC_OVERHEAD] = math.nan
                continue
            slot = (qhead[q] + qlen[q]) & mask
            qtime[q, slot] = t
            qid[q, slot] = request_id
            qlen[q] += 1
            depth += 1
            if depth > max_depth:
                max_depth = depth
            cand[q] = _dispatch_time(
                qlen[q],
                max_batch,
                qtime[q, qhead[q]],
                qtime[q, (qhead[q] + max_batch - 1) & mask],
                timeout_s,
                free_min if routing == ROUTE_SHARED else worker_free[q],
                t_start,
            )
            continue

        if best_d >= t_end:
            break

        # Dispatch one batch from best_q at best_d.
        q = best_q
        size = min(max_batch, qlen[q])
        service_s = service_mean_s[size]
        sigma = service_sigma[size]
        if sigma > 0.0:
            z = normals[istate[IS_NORMAL_POS]]
            istate[IS_NORMAL_POS] += 1
            service_s *= math.exp(sigma * z - 0.5 * sigma * sigma)
        worker = free_worker if routing == ROUTE_SHARED else q
        done_at = best_d + service_s
        worker_free[worker] = done_at
        batch_id = istate[IS_BATCHES]
        istate[IS_BATCHES] += 1
        latency_sum = 0.0
        latency_max = stats[ST_LATENCY_MAX_S]
        within = 0
        head = qhead[q]
        # FIFO: latencies fall along the batch, so the bucket only ever steps down from
        # the first request's, and a logarithm per batch (not per request) suffices.
        b = _bucket_guess(done_at - qtime[q, head], min_value_s, inv_log_gamma, num_buckets)
        while b + 1 < num_buckets and done_at - qtime[q, head] >= bucket_lower[b + 1]:
            b += 1
        for j in range(size):
            slot = (head + j) & mask
            latency_s = done_at - qtime[q, slot]
            while b > 0 and latency_s < bucket_lower[b]:
                b -= 1
            hists[HIST_TICK, b] += 1
            latency_sum += latency_s
            latency_max = max(latency_max, latency_s)
            within += latency_s <= slo_s
            overhead = 0.0
            if client:
                u = uniforms[istate[IS_UNIFORM_POS]]
                istate[IS_UNIFORM_POS] += 1
                overhead = _overhead_draw(u, overhead_s)
                client_s = latency_s + overhead
                cb = _bucket_of(client_s, min_value_s, inv_log_gamma, bucket_lower)
                hists[HIST_CLIENT, cb] += 1
                stats[ST_CLIENT_LATENCY_SUM_S] += client_s
                stats[ST_CLIENT_WITHIN_SLO] += client_s <= slo_s
            if record:
                r = istate[IS_RECORDS]
                istate[IS_RECORDS] += 1
                records[r, REC_ID] = qid[q, slot]
                records[r, REC_ARRIVED_AT] = qtime[q, slot]
                records[r, REC_DISPATCHED_AT] = best_d
                records[r, REC_COMPLETED_AT] = done_at
                records[r, REC_WORKER] = worker
                records[r, REC_BATCH] = batch_id
                records[r, REC_OVERHEAD] = overhead
        stats[ST_LATENCY_SUM_S] += latency_sum
        stats[ST_LATENCY_MAX_S] = latency_max
        stats[ST_WITHIN_SLO] += within
        qhead[q] = (head + size) & mask
        qlen[q] -= size
        depth -= size
        stats[ST_COMPLETED] += size
        stats[ST_BATCHES] += 1
        stats[ST_BATCH_SIZE_SUM] += size
        stats[ST_FILL_SUM] += size / max_batch
        stats[ST_BUSY_S] += service_s

        if routing == ROUTE_SHARED:
            free_min = math.inf
            for w in range(num_workers):
                if worker_free[w] < free_min:
                    free_min, free_worker = worker_free[w], w
        cand[q] = _dispatch_time(
            qlen[q],
            max_batch,
            qtime[q, qhead[q]],
            qtime[q, (qhead[q] + max_batch - 1) & mask],
            timeout_s,
            free_min if routing == ROUTE_SHARED else worker_free[q],
            t_start,
        )

    stats[ST_MAX_QUEUE_DEPTH] = max_depth
    stats[ST_QUEUE_DEPTH_END] = depth
    stats[ST_P50_S] = _quantile(hists[HIST_TICK], 0.5, representatives)
    stats[ST_P99_S] = _quantile(hists[HIST_TICK], 0.99, representatives)
    if client:
        stats[ST_CLIENT_P50_S] = _quantile(hists[HIST_CLIENT], 0.5, representatives)
        stats[ST_CLIENT_P99_S] = _quantile(hists[HIST_CLIENT], 0.99, representatives)
    else:
        stats[ST_CLIENT_P50_S] = math.nan
        stats[ST_CLIENT_P99_S] = math.nan


@njit(cache=True)
def spread_poisson_pieces(piece_start_s, piece_length_s, counts, exponentials):
    """Place counts[k] sorted arrival times uniformly in piece k.

    Uses normalised cumulative sums of exponential spacings (the order statistics of
    uniforms) so no sort is needed; `exponentials` holds sum(counts) + len(counts) draws.
    """
    total = 0
    for k in range(counts.shape[0]):
        total += counts[k]
    out = np.empty(total)
    pos = 0
    e = 0
    for k in range(counts.shape[0]):
        n = counts[k]
        if n == 0:
            e += 1
            continue
        span = 0.0
        for j in range(n + 1):
            span += exponentials[e + j]
        acc = 0.0
        scale = piece_length_s[k] / span
        for j in range(n):
            acc += exponentials[e + j]
            out[pos + j] = piece_start_s[k] + acc * scale
        pos += n
        e += n + 1
    return out
