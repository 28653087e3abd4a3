/*
 * A session's life: connect, hello and welcome, the session's figures, and
 * close. Trainer and control connections share all of it but the role.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"

/* The public enums are gradsync.proto's (the source): the welcome's values
 * and a tensor's dtype pass between them by a cast. */
#define GS_SAME(a, b) _Static_assert((int)(a) == (int)(b), #a " is " #b)
GS_SAME(GS_FLOAT32, GRADSYNC__DTYPE__DTYPE_FLOAT32);
GS_SAME(GS_FLOAT16, GRADSYNC__DTYPE__DTYPE_FLOAT16);
GS_SAME(GS_BFLOAT16, GRADSYNC__DTYPE__DTYPE_BFLOAT16);
GS_SAME(GS_FLOAT64, GRADSYNC__DTYPE__DTYPE_FLOAT64);
GS_SAME(GS_INT32, GRADSYNC__DTYPE__DTYPE_INT32);
GS_SAME(GS_INT64, GRADSYNC__DTYPE__DTYPE_INT64);
GS_SAME(GS_UINT8, GRADSYNC__DTYPE__DTYPE_UINT8);
GS_SAME(GS_WIRE_DTYPE_FP16, GRADSYNC__WIRE_DTYPE__WIRE_FP16);
GS_SAME(GS_WIRE_DTYPE_BF16, GRADSYNC__WIRE_DTYPE__WIRE_BF16);
GS_SAME(GS_WIRE_DTYPE_FP32, GRADSYNC__WIRE_DTYPE__WIRE_FP32);
GS_SAME(GS_OP_AVERAGE, GRADSYNC__REDUCE_OP__OP_AVERAGE);
GS_SAME(GS_OP_SUM, GRADSYNC__REDUCE_OP__OP_SUM);
#undef GS_SAME

/* local_rank went into the padding after global_rank: callers built before
 * it pass a struct of the same size, and struct gs_status, which holds one,
 * keeps its layout. */
_Static_assert(sizeof(void *) != 8 || sizeof(struct gs_session_info) == 72,
	       "struct gs_session_info changed size");

static const char *socket_path(const char *path)
{
	if (path)
		return path;
	const char *env = secure_getenv("GRADSYNC_SOCKET");
	return env && *env ? env : GS_DEFAULT_SOCKET;
}

/* A source that gave no value: the field is sent unset, and not checked. */
static bool given(const char *source)
{
	return strcmp(source, "default") != 0 && strcmp(source, "unset") != 0;
}

/* The trainer's view of its job, each field only where a source gave it. */
static void fill_view(Gradsync__Hello *h, const struct gs_launch_info *li,
		      Gradsync__UInt64Value *node_rank, Gradsync__UInt64Value *threshold,
		      Gradsync__DoubleValue *predivide)
{
	if (given(li->local_size_source))
		h->local_size = li->local_size;
	if (given(li->nodes_source))
		h->nodes = li->nodes;
	if (given(li->node_rank_source)) {
		node_rank->value = li->node_rank;
		h->node_rank = node_rank;
	}
	if (given(li->coordinator_source))
		h->coordinator = (char *)li->coordinator;
	if (given(li->threshold_source)) {
		threshold->value = li->threshold;
		h->threshold = threshold;
	}
	if (given(li->wire_dtype_source))
		h->wire_dtype = (Gradsync__WireDtype)li->wire_dtype;
	if (given(li->op_source))
		h->op = (Gradsync__ReduceOp)li->op;
	if (given(li->predivide_source)) {
		predivide->value = li->predivide_factor;
		h->predivide_factor = predivide;
	}
	if (given(li->fusion_buffer_source))
		h->fusion_buffer_elements = li->fusion_buffer_elements;
}

static int send_hello(struct gs_client *c, int timeout_ms)
{
	Gradsync__Hello hello = GRADSYNC__HELLO__INIT;
	Gradsync__UInt64Value node_rank = GRADSYNC__UINT64_VALUE__INIT;
	Gradsync__UInt64Value threshold = GRADSYNC__UINT64_VALUE__INIT;
	Gradsync__DoubleValue predivide = GRADSYNC__DOUBLE_VALUE__INIT;
	hello.protocol_version = GS_PROTOCOL_VERSION;
	hello.role = c->role;
	hello.local_rank = c->local_rank;
	hello.pid = (uint32_t)getpid();
	hello.job_id = c->job_id ? c->job_id : "";
	if (c->has_launch)
		fill_view(&hello, &c->launch, &node_rank, &threshold, &predivide);
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_HELLO;
	m.hello = &hello;
	return gs__conn_send(c, &m, NULL, 0, timeout_ms);
}

static int check_settings(struct gs_client *c, const Gradsync__Settings *s)
{
	if (!s)
		return gs__fail_dead(c, GS_EPROTO,
				    "protocol error: gradsyncd's welcome has no settings");
	if (s->wire_dtype < GRADSYNC__WIRE_DTYPE__WIRE_FP16 ||
	    s->wire_dtype > GRADSYNC__WIRE_DTYPE__WIRE_FP32 ||
	    s->op < GRADSYNC__REDUCE_OP__OP_AVERAGE ||
	    s->op > GRADSYNC__REDUCE_OP__OP_SUM)
		return gs__fail_dead(c, GS_EPROTO,
				    "protocol error: gradsyncd's welcome has wire dtype %d and op %d",
				    (int)s->wire_dtype, (int)s->op);
	return GS_OK;
}

static int take_welcome(struct gs_client *c, const Gradsync__Welcome *w)
{
	if (w->protocol_version != GS_PROTOCOL_VERSION)
		return gs__fail_dead(c, GS_EVERSION,
				    "gradsyncd speaks protocol version %u, this library %u",
				    w->protocol_version, GS_PROTOCOL_VERSION);
	int r = check_settings(c, w->settings);
	if (r < 0)
		return r;
	if (c->role == GRADSYNC__ROLE__ROLE_TRAINER &&
	    (w->world_size == 0 || w->local_size == 0))
		return gs__fail_dead(c, GS_EPROTO,
				    "protocol error: gradsyncd's welcome has world size %u, local size %u",
				    w->world_size, w->local_size);
	c->backend = strdup(w->backend ? w->backend : "");
	c->daemon_version = strdup(w->daemon_version ? w->daemon_version : "");
	if (!c->backend || !c->daemon_version)
		return gs__fail(c, GS_ENOMEM, "out of memory");

	struct gs_session_info *info = &c->info;
	info->world_size = w->world_size;
	info->local_size = w->local_size;
	info->node_rank = w->node_rank;
	info->global_rank = w->global_rank;
	info->local_rank = c->role == GRADSYNC__ROLE__ROLE_TRAINER ? c->local_rank : 0;
	info->nodes = w->nodes;
	info->backend = c->backend;
	info->daemon_version = c->daemon_version;
	info->threshold = w->settings->threshold;
	info->wire_dtype = (enum gs_wire_dtype)w->settings->wire_dtype;
	info->op = (enum gs_reduce_op)w->settings->op;
	info->predivide_factor = w->settings->predivide_factor;
	info->fusion_buffer_elements = w->settings->fusion_buffer_elements;
	return GS_OK;
}

/* Hello and welcome share one deadline with the connect. */
int gs__session_handshake(struct gs_client *c, int64_t deadline)
{
	c->expect = GRADSYNC__MESSAGE__BODY_WELCOME;
	int r = send_hello(c, gs__remaining(deadline));
	if (r < 0)
		return r;
	r = gs__conn_pump(c, gs__has_reply, gs__remaining(deadline));
	if (r < 0)
		return r;
	r = take_welcome(c, c->reply->welcome);
	gradsync__message__free_unpacked(c->reply, NULL);
	c->reply = NULL;
	return r;
}

int gs__session_open(const char *path, Gradsync__Role role,
		    const struct gs_launch_info *li, int timeout_ms, struct gs_client **out)
{
	*out = NULL;
	struct gs_client *c = calloc(1, sizeof(*c));
	if (!c)
		return gs__fail(NULL, GS_ENOMEM, "out of memory");
	c->fd = -1;
	c->role = role;
	c->local_rank = li ? li->local_rank : 0;
	if (li) {
		c->launch = *li;
		c->has_launch = true;
	}
	c->path = strdup(socket_path(path));
	c->job_id = strdup(li ? li->job_id : "");
	if (!c->path || !c->job_id) {
		gs_close(c);
		return gs__fail(NULL, GS_ENOMEM, "out of memory");
	}
	gs_frame_reader_init(&c->reader, GS_CLIENT_MAX_FRAME);
	gs__doing(c, "the connection");

	int64_t deadline = gs__deadline(timeout_ms);
	int r = gs__conn_open(c, c->path, deadline);
	if (r == GS_OK)
		r = gs__session_handshake(c, deadline);
	if (r < 0)
		goto err_client;
	*out = c;
	return GS_OK;

err_client:
	/* Without a handle the detail moves to this thread's last error. */
	gs__fail(NULL, r, "%s", c->error);
	gs_close(c);
	return r;
}

int gs_connect(const struct gs_connect_options *opts, gs_client **out)
{
	struct gs_connect_options o;
	struct gs_launch_info li;
	if (!out)
		return gs__fail(NULL, GS_EINVAL, "gs_connect: out is NULL");
	*out = NULL;
	int r = gs__connect_options_take(opts, &o, "gs_connect");
	if (r == GS_OK)
		r = gs__launch_derive(&o, &li);
	if (r < 0)
		return r;
	return gs__session_open(o.socket_path, GRADSYNC__ROLE__ROLE_TRAINER, &li,
			       o.timeout_ms, out);
}

void gs_close(gs_client *c)
{
	if (!c)
		return;
	gs__tensors_release(c);
	gs__state_release(c);
	if (c->reply)
		gradsync__message__free_unpacked(c->reply, NULL);
	gs_frame_reader_destroy(&c->reader);
	if (c->fd >= 0)
		close(c->fd);
	free(c->backend);
	free(c->daemon_version);
	free(c->path);
	free(c->job_id);
	free(c);
}

int gs_session_info(const gs_client *c, struct gs_session_info *info)
{
	if (!c || !info)
		return gs__fail(NULL, GS_EINVAL, "gs_session_info: NULL argument");
	*info = c->info;
	return GS_OK;
}

int gs_fd(const gs_client *c)
{
	return c ? c->fd : -1;
}
