#include "engine/trainer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/job.h"
#include "errors.h"
#include "frame.h"
#include "support/log.h"

/* As long as a connection's own Error message (serve/conn.c). */
#define GS_CLIENT_MESSAGE_MAX 512

static void vfail(const struct gs_client *c, int code, const char *fmt, va_list ap)
	__attribute__((format(printf, 3, 0)));

static void vfail(const struct gs_client *c, int code, const char *fmt, va_list ap)
{
	char msg[GS_CLIENT_MESSAGE_MAX];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	c->ops->fail(c->ctx, code, msg);
}

void gs_client_fail(const struct gs_client *c, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfail(c, code, fmt, ap);
	va_end(ap);
}

void gs_trainer_fail(struct gs_trainer *t, int code, const char *fmt, ...)
{
	if (!t->client.ctx)
		return;
	/* A copy: the client's going clears t->client.ctx meanwhile. */
	struct gs_client c = t->client;
	va_list ap;
	va_start(ap, fmt);
	vfail(&c, code, fmt, ap);
	va_end(ap);
}

void gs_trainer_send(struct gs_trainer *t, const Gradsync__Message *m)
{
	if (t->client.ctx)
		t->client.ops->send(t->client.ctx, m);
}

struct gs_trainer *gs_trainer_create(struct gs_job *job, const struct gs_client *client,
				     uint32_t rank)
{
	struct gs_trainer *t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	t->job = job;
	t->client = *client;
	t->rank = rank;
	t->pid = client->pid;
	t->uid = client->uid;
	return t;
}

void gs_trainer_destroy(struct gs_trainer *t)
{
	struct gs_backend *b = t->job->env.backend;
	for (uint32_t i = 0; i < t->nbuffers; i++)
		b->ops->release_buffer(b, t->buffers[i].addr, t->buffers[i].size);
	t->job->mappings -= t->nbuffers;
	free(t->buffers);
	gs_layout_free(&t->layout);
	free(t->tensor_buffer);
	free(t->tensor_offset);
	free(t->tensors);
	free(t->marked);
	free(t->bucket_event);
	/* Its state (engine/state.c), likewise. */
	for (uint32_t i = 0; i < t->state.nbuffers; i++)
		b->ops->release_buffer(b, t->state.buffers[i].addr, t->state.buffers[i].size);
	t->job->mappings -= t->state.nbuffers;
	free(t->state.buffers);
	gs_layout_free(&t->state.layout);
	free(t->state.tensor_buffer);
	free(t->state.tensor_offset);
	free(t->state.data);
	free(t->state.tensors);
	free(t);
}

uint32_t gs_trainer_rank(const struct gs_trainer *t)
{
	return t->rank;
}

const char *const gs_trainer_state_names[GS_TRAINER_STATES] = {
	[GS_TRAINER_CONNECTED] = "connected",
	[GS_TRAINER_REGISTERING] = "registering",
	[GS_TRAINER_WAITING_FOR_NODES] = "waiting for the other nodes",
	[GS_TRAINER_IDLE] = "idle",
	[GS_TRAINER_IN_STEP] = "in step",
	[GS_TRAINER_BROADCASTING] = "broadcasting state",
};

static enum gs_trainer_states state_of(const struct gs_trainer *t)
{
	if (t->state.asked)
		return GS_TRAINER_BROADCASTING;
	if (!t->registered) {
		if (t->layout_checked)
			return GS_TRAINER_WAITING_FOR_NODES;
		return t->layout.n ? GS_TRAINER_REGISTERING : GS_TRAINER_CONNECTED;
	}
	return t->in_step ? GS_TRAINER_IN_STEP : GS_TRAINER_IDLE;
}

const char *gs_trainer_state(const struct gs_trainer *t)
{
	return gs_trainer_state_names[state_of(t)];
}

const char *gs_dtype_name(Gradsync__Dtype d)
{
	switch (d) {
	case GRADSYNC__DTYPE__DTYPE_FLOAT32:
		return "float32";
	case GRADSYNC__DTYPE__DTYPE_FLOAT16:
		return "float16";
	case GRADSYNC__DTYPE__DTYPE_BFLOAT16:
		return "bfloat16";
	case GRADSYNC__DTYPE__DTYPE_FLOAT64:
		return "float64";
	case GRADSYNC__DTYPE__DTYPE_INT32:
		return "int32";
	case GRADSYNC__DTYPE__DTYPE_INT64:
		return "int64";
	case GRADSYNC__DTYPE__DTYPE_UINT8:
		return "uint8";
	default:
		return "unspecified";
	}
}

/* Takes the frame's descriptors (one per memfd buffer; CUDA buffers carry
 * handles instead) and imports each buffer into *arr (*narr of them so
 * far). Gradients' and state's buffers count together against the limits.
 * On failure the client is dropped and -1 returned. */
int gs_trainer_import_buffers(struct gs_trainer *t, const char *what, Gradsync__Buffer *const *bufs,
			      size_t n, struct gs_trainer_buffer **arr, uint32_t *narr)
{
	struct gs_job *j = t->job;
	const struct gs_settings *s = j->env.settings;
	struct gs_backend *b = j->env.backend;
	size_t nfds = 0, next_fd = 0, have = 0;
	uint64_t mine = (uint64_t)t->nbuffers + t->state.nbuffers;
	int fds[GS_FRAME_MAX_FDS];
	if (n > GS_FRAME_MAX_FDS) {
		gs_trainer_fail(t, GS_ELIMIT, "%s lists %zu buffers; at most %d per frame",
			     what, n, GS_FRAME_MAX_FDS);
		return -1;
	}
	/* Each buffer is a mapping in gradsyncd (a memfd, or a CUDA IPC
	 * import): bounded per trainer and for the node, under the kernel's
	 * vm.max_map_count, before any is made. */
	if (n > s->max_buffers - mine) {
		gs_trainer_fail(t, GS_ELIMIT, "%s brings its buffers to %llu; at most %llu per trainer (--max-buffers)",
			     what, (unsigned long long)mine + n, (unsigned long long)s->max_buffers);
		return -1;
	}
	if (n > s->max_mappings - j->mappings) {
		gs_trainer_fail(t, GS_ELIMIT, "gradsyncd already maps %llu buffers of its trainers; at most %llu (--max-mappings)",
			     (unsigned long long)j->mappings, (unsigned long long)s->max_mappings);
		return -1;
	}
	for (size_t i = 0; i < n; i++)
		nfds += j->env.buffer_takes_fd(bufs[i]);
	if (t->client.ops->take_fds(t->client.ctx, fds, nfds, &have) < 0) {
		gs_trainer_fail(t, GS_EPROTO, "%s lists %zu buffers but only %zu descriptors arrived",
				what, nfds, have);
		return -1;
	}
	struct gs_trainer_buffer *grown = realloc(*arr, (*narr + n + 1) * sizeof(*grown));
	if (!grown) {
		for (size_t i = 0; i < nfds; i++)
			close(fds[i]);
		gs_trainer_fail(t, GS_ENOMEM, "out of memory registering buffers");
		return -1;
	}
	*arr = grown;
	int rc = 0;
	for (size_t i = 0; i < n; i++) {
		const Gradsync__Buffer *m = bufs[i];
		int fd = j->env.buffer_takes_fd(m) ? fds[next_fd++] : -1;
		uint64_t size = m->size;
		char why[256];
		if (rc == 0 && size > s->max_bytes - t->buffer_bytes) {
			gs_trainer_fail(t, GS_ELIMIT, "buffer %u of %llu bytes passes the limit of %llu registered bytes (--max-bytes)",
				     *narr, (unsigned long long)size,
				     (unsigned long long)s->max_bytes);
			rc = -1;
		}
		struct gs_buffer_desc desc;
		void *addr = NULL;
		int err = rc == 0 ? j->env.parse_buffer(m, t->rank, fd, &desc, why, sizeof(why)) : GS_OK;
		if (rc == 0 && err == GS_OK)
			err = b->ops->import_buffer(b, &desc, &addr, why, sizeof(why));
		if (rc == 0 && err != GS_OK) {
			gs_trainer_fail(t, err, "%s buffer %u: %s", what, *narr, why);
			rc = -1;
		}
		if (fd >= 0)
			close(fd); /* the mapping keeps the memory */
		if (rc == 0) {
			(*arr)[(*narr)++] = (struct gs_trainer_buffer){ addr, size };
			t->buffer_bytes += size;
			j->mappings++;
		}
	}
	return rc;
}

/* Names reach logs, status and other nodes: no line breaks or escapes. */
bool gs_name_has_control_char(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return true;
	return false;
}

static int check_tensor(struct gs_trainer *t, const Gradsync__TensorSpec *ts)
{
	const struct gs_settings *s = t->job->env.settings;
	uint32_t index = t->layout.n;
	const char *name = ts->name ? ts->name : "";
	if (name[0] == '\0' || strlen(name) > GS_MAX_NAME) {
		gs_trainer_fail(t, GS_EINVAL, "tensor %u: name must have 1 to %d bytes", index, GS_MAX_NAME);
		return -1;
	}
	if (gs_name_has_control_char(name)) {
		gs_trainer_fail(t, GS_EINVAL, "tensor %u: name holds a control character", index);
		return -1;
	}
	if (ts->dtype != GRADSYNC__DTYPE__DTYPE_FLOAT32) {
		gs_trainer_fail(t, GS_EDTYPE, "tensor '%s' has dtype %s; only float32 is supported",
			     name, gs_dtype_name(ts->dtype));
		return -1;
	}
	if (ts->count == 0) {
		gs_trainer_fail(t, GS_EINVAL, "tensor '%s' has zero elements", name);
		return -1;
	}
	if (index >= s->max_tensors) {
		gs_trainer_fail(t, GS_ELIMIT, "more than %llu tensors (--max-tensors)",
			     (unsigned long long)s->max_tensors);
		return -1;
	}
	if (ts->count > (s->max_bytes - t->bytes) / sizeof(float)) {
		gs_trainer_fail(t, GS_ELIMIT, "tensor '%s' (%llu elements) passes the limit of %llu registered bytes (--max-bytes)",
			     name, (unsigned long long)ts->count, (unsigned long long)s->max_bytes);
		return -1;
	}
	if (ts->buffer >= t->nbuffers) {
		gs_trainer_fail(t, GS_EINVAL, "tensor '%s' names buffer %llu; only %u registered",
			     name, (unsigned long long)ts->buffer, t->nbuffers);
		return -1;
	}
	uint64_t size = t->buffers[ts->buffer].size;
	uint64_t bytes = ts->count * sizeof(float);
	if (ts->offset % sizeof(float) || ts->offset > size || bytes > size - ts->offset) {
		gs_trainer_fail(t, GS_EBUFFER, "tensor '%s' (%llu bytes at offset %llu) does not fit in buffer %llu of %llu bytes, or is misaligned",
			     name, (unsigned long long)bytes, (unsigned long long)ts->offset,
			     (unsigned long long)ts->buffer, (unsigned long long)size);
		return -1;
	}
	return 0;
}

static int add_tensor(struct gs_trainer *t, const Gradsync__TensorSpec *ts)
{
	uint32_t i = t->layout.n;
	if (gs_layout_add(&t->layout, ts->name, ts->count) < 0)
		return -1;
	if ((i & (i - 1)) == 0) { /* grow the side arrays at powers of two */
		size_t cap = i ? 2 * (size_t)i : 1;
		uint32_t *tb = realloc(t->tensor_buffer, cap * sizeof(*tb));
		if (tb)
			t->tensor_buffer = tb;
		uint64_t *to = realloc(t->tensor_offset, cap * sizeof(*to));
		if (to)
			t->tensor_offset = to;
		if (!tb || !to)
			return -1;
	}
	t->tensor_buffer[i] = ts->buffer;
	t->tensor_offset[i] = ts->offset;
	t->bytes += ts->count * sizeof(float);
	return 0;
}

/* The whole layout is here: resolve pointers, check it against the job. */
static void finish_registration(struct gs_trainer *t)
{
	uint32_t n = t->layout.n, a, b;
	if (n == 0) {
		gs_trainer_fail(t, GS_EINVAL, "registration lists no tensors");
		return;
	}
	if (gs_layout_find_duplicate(&t->layout, &a, &b) == 1) {
		gs_trainer_fail(t, GS_EINVAL, "tensor name '%s' appears twice (tensors %u and %u)",
			     t->layout.names[a], a, b);
		return;
	}
	t->tensors = calloc(n, sizeof(*t->tensors));
	t->marked = calloc(n, sizeof(*t->marked));
	if (!t->tensors || !t->marked) {
		gs_trainer_fail(t, GS_ENOMEM, "out of memory registering %u tensors", n);
		return;
	}
	for (uint32_t i = 0; i < n; i++)
		t->tensors[i] = (float *)((char *)t->buffers[t->tensor_buffer[i]].addr +
					  t->tensor_offset[i]);
	char why[512];
	int err = gs_job_adopt_layout(t->job, t, why, sizeof(why));
	if (err != GS_OK) {
		gs_trainer_fail(t, err, "%s", why);
		return;
	}
	t->layout_checked = true;
	gs_info("trainer %s registered %u tensors (%llu bytes) in %u buffers",
		t->client.ops->name(t->client.ctx), n, (unsigned long long)t->bytes, t->nbuffers);
	if (t->job->agreed)
		gs_trainer_send_registered(t);
}

void gs_trainer_send_registered(struct gs_trainer *t)
{
	t->registered = true;
	Gradsync__Registered reg = GRADSYNC__REGISTERED__INIT;
	reg.tensors = t->layout.n;
	reg.buckets = t->job->plan.nbuckets;
	reg.layout_hash = t->job->layout_hash;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_REGISTERED;
	m.registered = &reg;
	gs_trainer_send(t, &m);
}

void gs_trainer_register(struct gs_trainer *t, const Gradsync__RegisterTensors *r)
{
	if (t->layout_checked) {
		gs_trainer_fail(t, GS_ESTATE, "tensors are already registered on this connection");
		return;
	}
	if (gs_trainer_import_buffers(t, "RegisterTensors", r->buffers, r->n_buffers, &t->buffers,
				      &t->nbuffers) < 0)
		return;
	for (size_t i = 0; i < r->n_tensors; i++) {
		if (check_tensor(t, r->tensors[i]) < 0)
			return;
		if (add_tensor(t, r->tensors[i]) < 0) {
			gs_trainer_fail(t, GS_ENOMEM, "out of memory registering tensors");
			return;
		}
	}
	if (r->last)
		finish_registration(t);
}

int gs_trainer_lost_buffer(const struct gs_trainer *t)
{
	bool (*lost)(const void *addr) = t->job->env.memory_lost;
	for (uint32_t i = 0; lost && i < t->nbuffers; i++)
		if (lost(t->buffers[i].addr))
			return (int)i;
	return -1;
}

void gs_trainer_disconnected(struct gs_trainer *t)
{
	t->client.ctx = NULL;
	gs_job_detach(t->job, t);
}
