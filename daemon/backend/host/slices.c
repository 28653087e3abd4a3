/*
 * The host backend's slices: one slice of a chunk packed or unpacked, and
 * the worker thread and its helpers claiming a phase's slices.
 *
 * On a node of several trainers, the pack+sum and unpack phases of a large
 * chunk are cut into slices that up to one thread per local trainer (the
 * worker thread and helpers of this backend) claim one at a time: the
 * reduce does M times the memory traffic of one trainer, and the
 * trainers' own cores wait for it. Claiming, rather than a fixed share per
 * thread, keeps a thread the scheduler delays (other work on the machine)
 * from holding up the phase by more than one slice. Every element is
 * computed by the same kernels whichever thread does it, so the result
 * does not depend on the split.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/host/host_private.h"

/* ---- One slice of a chunk -------------------------------------------- */

static void slice_pack(struct host_backend *h, struct host_thread *t, const struct gs_span *sp,
		       size_t nspans, char *dst)
{
	const struct gs_bucket_io *io = h->phase.io;
	size_t esize = gs_wire_size(h->base.wire);
	const float *srcs[GS_PACK_SUM_MAX_SOURCES];
	for (size_t i = 0; i < nspans; i++) {
		for (unsigned r = 0; r < io->nranks; r++)
			srcs[r] = io->tensors[r][sp[i].tensor] + sp[i].offset;
		gs_pack_sum(h->base.wire, dst, srcs, io->nranks, sp[i].count, io->pack,
			    t->clipped);
		dst += sp[i].count * esize;
	}
}

/* Elements [first, ...) of the chunk, spans sp; with the phase's blocks,
 * their squares summed in them too. */
static void slice_unpack(struct host_backend *h, struct host_thread *t,
			 const struct gs_span *sp, size_t nspans, const char *src,
			 uint64_t first)
{
	const struct gs_bucket_io *io = h->phase.io;
	size_t esize = gs_wire_size(h->base.wire);
	float *dsts[GS_PACK_SUM_MAX_SOURCES];
	for (size_t i = 0; i < nspans; i++) {
		/* No trainer produced it: each keeps what its memory holds,
		 * and the norm leaves it out, as torch's leaves out a None. */
		if (io->produced && !io->produced[sp[i].tensor]) {
			src += sp[i].count * esize;
			first += sp[i].count;
			continue;
		}
		for (unsigned r = 0; r < io->nranks; r++)
			dsts[r] = io->tensors[r][sp[i].tensor] + sp[i].offset;
		if (h->phase.blocks)
			t->nonfinite += gs_unpack_norm(h->base.wire, dsts, io->nranks, src,
						       sp[i].count, io->postscale, first,
						       h->phase.blocks);
		else
			t->nonfinite += gs_unpack(h->base.wire, dsts, io->nranks, src,
						  sp[i].count, io->postscale);
		src += sp[i].count * esize;
		first += sp[i].count;
	}
}

/* A sliced phase is claimed in units: each slice in pieces of at most
 * ph->unit elements, so that the threads share a slice as they share an
 * unsliced chunk. Unit i of the phase is a piece of slice *k. */
static uint32_t units_in(const struct host_phase *ph, uint32_t k)
{
	uint64_t n = host_cut_len(&ph->cut, k);
	return n <= ph->unit ? 1 : (uint32_t)((n + ph->unit - 1) / ph->unit);
}

static void unit_at(const struct host_phase *ph, uint32_t i, uint32_t *k, uint64_t *first,
		    uint64_t *n)
{
	uint32_t s = 0, u;
	while (i >= (u = units_in(ph, s))) {
		i -= u;
		s++;
	}
	uint64_t begin = host_cut_first(&ph->cut, s), end = begin + host_cut_len(&ph->cut, s);
	*k = s;
	*first = begin + i * ph->unit;
	*n = end - *first < ph->unit ? end - *first : ph->unit;
}

/* Elements [first, first + n) of the chunk in the current phase, its
 * slice k: in a sliced phase, pipeline slice k, after k statuses. */
static void run_slice(struct host_backend *h, struct host_thread *t, uint32_t k, uint64_t first,
		      uint64_t n)
{
	const struct host_phase *ph = &h->phase;
	const struct gs_bucket_io *io = ph->io;
	size_t nspans = gs_plan_chunk_spans(io->plan, io->counts, io->bucket, ph->start + first, n,
					    t->spans, h->span_room);
	uint64_t statuses = ph->sliced ? host_cut_statuses(&ph->cut, ph->gap, k) : 0;
	char *at = ph->wire + (first + statuses) * gs_wire_size(h->base.wire);
	if (ph->unpack)
		slice_unpack(h, t, t->spans, nspans, at, first);
	else
		slice_pack(h, t, t->spans, nspans, at);
}

/* ---- Claiming slices ---------------------------------------------------- */

static uint64_t claim_word(uint32_t round, uint32_t slices, uint32_t next)
{
	return (uint64_t)round << 40 | (uint64_t)slices << 20 | next;
}

/* Claims the next slice of `round` into *slice (and its round's slice
 * count into *slices); false when none is left or the round is over. */
static bool claim_slice(struct host_backend *h, uint32_t round, uint32_t *slice, uint32_t *slices)
{
	uint64_t v = atomic_load(&h->claim);
	for (;;) {
		uint32_t r = (uint32_t)(v >> 40), total = (v >> 20) & SLICE_MASK, next = v & SLICE_MASK;
		if (r != round || next >= total)
			return false;
		if (atomic_compare_exchange_weak(&h->claim, &v, v + 1)) {
			*slice = next;
			*slices = total;
			return true;
		}
	}
}

/* Does slices of `round` while there are any; the thread that finishes the
 * round's last slice wakes the worker if it waits. */
static void work_round(struct host_backend *h, struct host_thread *t, uint32_t round)
{
	uint32_t slice, slices;
	while (claim_slice(h, round, &slice, &slices)) {
		const struct host_phase *ph = &h->phase;
		if (ph->sliced) {
			uint32_t k;
			uint64_t first, n;
			unit_at(ph, slice, &k, &first, &n);
			run_slice(h, t, k, first, n);
			/* The thread that packs a slice's last unit gives it on. */
			if (!ph->unpack && atomic_fetch_sub(&h->left[k], 1) == 1)
				host_slice_packed(h, k);
		} else {
			uint64_t first = slice * ph->slice;
			run_slice(h, t, 0, first,
				  ph->len - first < ph->slice ? ph->len - first : ph->slice);
		}
		if (atomic_fetch_add(&h->done, 1) + 1 == slices && t->index != 0) {
			pthread_mutex_lock(&h->lock);
			pthread_cond_signal(&h->finished);
			pthread_mutex_unlock(&h->lock);
		}
	}
}

static void *helper_main(void *arg)
{
	struct host_thread *t = arg;
	struct host_backend *h = t->h;
	uint32_t seen = 0;
	pthread_mutex_lock(&h->lock);
	for (;;) {
		while (h->go_round == seen && !h->stopping)
			pthread_cond_wait(&h->go, &h->lock);
		if (h->stopping)
			break;
		seen = h->go_round;
		pthread_mutex_unlock(&h->lock);
		work_round(h, t, seen);
		pthread_mutex_lock(&h->lock);
	}
	pthread_mutex_unlock(&h->lock);
	return NULL;
}

/* Runs h->phase to its end: in one piece on this thread, or in slices that
 * this thread and the helpers claim. */
void host_run_phase(struct host_backend *h)
{
	uint64_t len = h->phase.len, size = len;
	if ((h->nthreads > 1 || h->phase.in_pieces) && len > h->claim_len)
		size = h->claim_len;
	uint32_t slices = len ? (uint32_t)((len + size - 1) / size) : 0;
	struct host_phase *ph = &h->phase;
	/* A sliced chunk in units: one thread packs each slice whole, to give
	 * it on as soon as it is packed; several share it in pieces. */
	if (ph->sliced) {
		ph->unit = h->nthreads > 1 || ph->in_pieces ? h->claim_len : UINT64_MAX;
		slices = 0;
		for (uint32_t k = 0; k < host_cut_slices(&ph->cut); k++) {
			atomic_store(&h->left[k], units_in(ph, k));
			slices += units_in(ph, k);
		}
	}
	ph->slice = size;
	/* Rounds run 1 .. ROUND_MASK: the helpers start having seen round 0. */
	h->round = h->round % ROUND_MASK + 1;
	atomic_store(&h->done, 0);
	atomic_store(&h->claim, claim_word(h->round, slices, 0));
	if (slices > 1) {
		pthread_mutex_lock(&h->lock);
		h->go_round = h->round;
		pthread_cond_broadcast(&h->go);
		pthread_mutex_unlock(&h->lock);
	}
	work_round(h, &h->thread[0], h->round);
	if (slices > 1) {
		pthread_mutex_lock(&h->lock);
		while (atomic_load(&h->done) < slices)
			pthread_cond_wait(&h->finished, &h->lock);
		pthread_mutex_unlock(&h->lock);
	}
}

void host_stop_helpers(struct host_backend *h)
{
	pthread_mutex_lock(&h->lock);
	h->stopping = true;
	pthread_cond_broadcast(&h->go);
	pthread_mutex_unlock(&h->lock);
	for (unsigned t = 1; t < h->nthreads; t++)
		pthread_join(h->helper[t], NULL);
	h->nthreads = 1;
}

/* Starts want - 1 helpers (fewer if thread creation fails: the slices then
 * go to fewer threads). */
void host_start_helpers(struct host_backend *h, unsigned want)
{
	h->nthreads = 1;
	for (unsigned t = 1; t < want; t++) {
		if (pthread_create(&h->helper[t], NULL, helper_main, &h->thread[t]) != 0)
			break;
		char name[32];
		snprintf(name, sizeof(name), "gs-pack-%u", t);
		name[15] = '\0'; /* a thread's name has 15 bytes at most */
		pthread_setname_np(h->helper[t], name);
		h->nthreads++;
	}
}
