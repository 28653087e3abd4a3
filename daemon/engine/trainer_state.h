/*
 * What a trainer's state and the job's state layout hold (state.h handles
 * them): data only, so that the job and its trainers can hold them
 * without calling into state.c.
 */
#ifndef GS_TRAINER_STATE_H
#define GS_TRAINER_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "engine/layout.h"

struct gs_trainer_buffer;
struct state_run;

/* A trainer's registered state and its broadcast request. */
struct gs_trainer_state {
	bool checked; /* StateRegistered sent */
	struct gs_trainer_buffer *buffers;
	uint32_t nbuffers;
	struct gs_layout layout;
	uint32_t *tensor_buffer; /* per tensor, while registering */
	uint64_t *tensor_offset;
	void **data; /* per tensor, once registered */
	uint64_t bytes;

	/* Its BroadcastState, until answered. */
	bool asked;
	uint64_t seq;
	uint64_t source;
	uint32_t *tensors; /* NULL: all */
	size_t ntensors;
};

/* The job's state layout and the broadcast in progress. */
struct gs_job_state {
	bool has_layout;
	struct gs_layout layout;
	uint32_t layout_rank;
	uint64_t layout_hash;
	uv_timer_t timer;  /* bounds the wait for every trainer to ask */
	bool running;      /* copies on the worker */
	uint64_t first_ask_ns;
	/* A broadcast whose group of nodes failed, held a moment (the timer)
	 * for the news of which node went away, so that its answer names it. */
	struct state_run *held;
	char lost_why[256]; /* that news, since the broadcast began */
};

#endif
