/*
 * A job's settings from its trainers, without a daemon: what a first
 * trainer's Hello defines (defaults, limits, the coordinator's address),
 * which fields of a later trainer's are compared, when, and the words of
 * a difference.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "engine/job_view.h"

static void job(struct gs_settings *s)
{
	memset(s, 0, sizeof(*s));
	s->local_size = 4;
	s->nodes = 2;
	s->node_rank = 1;
	snprintf(s->coordinator, sizeof(s->coordinator), "[fe80::1]:29500");
	s->threshold = 65536;
	s->wire = 2;  /* bf16 */
	s->op = 1;    /* average */
	s->predivide = 0; /* the world size */
	s->fusion_elements = 8192;
}

/* The words for h, or "" when h agrees. */
static const char *verdict(const struct gs_settings *s, const Gradsync__Hello *h)
{
	static char err[600];
	err[0] = '\0';
	bool d = gs_job_view_differs(s, "j", h, err, sizeof(err));
	assert_int_equal(d, err[0] != '\0');
	return err;
}

static void unset_fields_are_not_compared(void **state)
{
	(void)state;
	struct gs_settings s;
	job(&s);
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	assert_string_equal(verdict(&s, &h), "");
}

static void agreeing_fields_pass(void **state)
{
	(void)state;
	struct gs_settings s;
	job(&s);
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	Gradsync__UInt64Value rank = GRADSYNC__UINT64_VALUE__INIT, thr = GRADSYNC__UINT64_VALUE__INIT;
	Gradsync__DoubleValue pre = GRADSYNC__DOUBLE_VALUE__INIT;
	rank.value = 1;
	thr.value = 65536;
	pre.value = 0;
	h.local_size = 4;
	h.nodes = 2;
	h.node_rank = &rank;
	h.coordinator = "FE80::1"; /* case aside, without the brackets */
	h.threshold = &thr;
	h.wire_dtype = GRADSYNC__WIRE_DTYPE__WIRE_BF16;
	h.op = GRADSYNC__REDUCE_OP__OP_AVERAGE;
	h.predivide_factor = &pre;
	h.fusion_buffer_elements = 8192;
	assert_string_equal(verdict(&s, &h), "");
	h.coordinator = "[fe80::1]";
	assert_string_equal(verdict(&s, &h), "");
}

static void each_difference_is_named(void **state)
{
	(void)state;
	struct gs_settings s;
	job(&s);
	Gradsync__UInt64Value v = GRADSYNC__UINT64_VALUE__INIT;
	Gradsync__DoubleValue pre = GRADSYNC__DOUBLE_VALUE__INIT;
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;

	h.local_size = 8;
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says local size 8, the job has 4 (set by its first trainer)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.nodes = 3;
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says node count 3, the job has 2 (set by its first trainer)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	v.value = 0; /* 0 is a value: a node rank, sent */
	h.node_rank = &v;
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says node rank 0, the job has 1 (set by its first trainer)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.coordinator = "fe80::2";
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says coordinator 'fe80::2', the job has 'fe80::1' (set by its first trainer)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	v.value = 0;
	h.threshold = &v;
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says threshold 0, the job has 65536 (set by its first trainer)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.wire_dtype = GRADSYNC__WIRE_DTYPE__WIRE_FP32;
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says wire dtype fp32, the job has bf16 (set by its first trainer)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.wire_dtype = (Gradsync__WireDtype)77; /* a raw client's: named, not indexed */
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says wire dtype unknown, the job has bf16 (set by its first trainer)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.op = GRADSYNC__REDUCE_OP__OP_SUM;
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says op sum, the job has average (set by its first trainer)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	pre.value = 2;
	h.predivide_factor = &pre;
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says predivide 2, the job has world (set by its first trainer)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.fusion_buffer_elements = 1024;
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says fusion buffer 1024, the job has 8192 (set by its first trainer)");
}

/* A job of one node has no coordinator to agree on. */
static void one_node_skips_the_coordinator(void **state)
{
	(void)state;
	struct gs_settings s;
	job(&s);
	s.nodes = 1;
	s.node_rank = 0;
	s.coordinator[0] = '\0';
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	h.coordinator = "anywhere";
	assert_string_equal(verdict(&s, &h), "");
}

static void node(struct gs_settings *s)
{
	memset(s, 0, sizeof(*s));
	s->node_port = 29450;
	s->max_nodes = 8;
	s->max_fusion_elements = 1u << 23;
	snprintf(s->node_address, sizeof(s->node_address), "10.0.0.7");
}

/* The first trainer's unset fields take the defaults. */
static void a_bare_hello_defines_the_defaults(void **state)
{
	(void)state;
	struct gs_settings n, js;
	node(&n);
	char err[400] = "";
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	assert_int_equal(gs_job_settings_from_hello(&n, "x", &h, &js, err, sizeof(err)), 0);
	assert_string_equal(js.job_id, "x");
	assert_int_equal(js.local_size, 1);
	assert_int_equal(js.nodes, 1);
	assert_int_equal(js.node_rank, 0);
	assert_int_equal(js.threshold, 2097152);
	assert_int_equal(js.wire, 1);  /* fp16 */
	assert_int_equal(js.op, 1);    /* average */
	assert_true(js.predivide == 0);
	assert_int_equal(js.fusion_elements, 4194304);
	assert_string_equal(js.coordinator, "");
	assert_string_equal(js.gloo_host, "10.0.0.7");
	assert_int_equal(js.node_port, 29450); /* the node's settings come along */
}

/* What the first trainer says is the job's; its coordinator is reached
 * on the node port, an IPv6 literal in brackets. */
static void the_first_hello_defines_the_job(void **state)
{
	(void)state;
	struct gs_settings n, js;
	node(&n);
	char err[400] = "";
	Gradsync__UInt64Value rank = GRADSYNC__UINT64_VALUE__INIT, thr = GRADSYNC__UINT64_VALUE__INIT;
	Gradsync__DoubleValue pre = GRADSYNC__DOUBLE_VALUE__INIT;
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	rank.value = 2;
	thr.value = 1000;
	pre.value = 4;
	h.local_rank = 3;
	h.local_size = 4;
	h.nodes = 3;
	h.node_rank = &rank;
	h.coordinator = "node0.example";
	h.threshold = &thr;
	h.wire_dtype = GRADSYNC__WIRE_DTYPE__WIRE_BF16;
	h.op = GRADSYNC__REDUCE_OP__OP_SUM;
	h.predivide_factor = &pre;
	h.fusion_buffer_elements = 65536;
	assert_int_equal(gs_job_settings_from_hello(&n, "x", &h, &js, err, sizeof(err)), 0);
	assert_int_equal(js.local_size, 4);
	assert_int_equal(js.nodes, 3);
	assert_int_equal(js.node_rank, 2);
	assert_string_equal(js.coordinator, "node0.example:29450");
	assert_int_equal(js.threshold, 1000);
	assert_int_equal(js.wire, 2);
	assert_int_equal(js.op, 2);
	assert_true(js.predivide == 4);
	assert_int_equal(js.fusion_elements, 65536);
	h.coordinator = "[fe80::1]";
	assert_int_equal(gs_job_settings_from_hello(&n, "x", &h, &js, err, sizeof(err)), 0);
	assert_string_equal(js.coordinator, "[fe80::1]:29450");
	h.coordinator = "fe80::1";
	assert_int_equal(gs_job_settings_from_hello(&n, "x", &h, &js, err, sizeof(err)), 0);
	assert_string_equal(js.coordinator, "[fe80::1]:29450");
}

static const char *refusal(const Gradsync__Hello *h)
{
	static char err[400];
	struct gs_settings n, js;
	node(&n);
	err[0] = '\0';
	assert_int_equal(gs_job_settings_from_hello(&n, "x", h, &js, err, sizeof(err)), -1);
	return err;
}

/* Out of the node's limits, or a job that cannot be: refused, named. */
static void limits_are_named(void **state)
{
	(void)state;
	Gradsync__UInt64Value rank = GRADSYNC__UINT64_VALUE__INIT;
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	h.fusion_buffer_elements = (1u << 23) + 1;
	assert_non_null(strstr(refusal(&h), "fusion buffer 8388609 elements is outside this node's [1024, 8388608] (--max-fusion-buffer)"));
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.local_size = 2;
	h.local_rank = 2;
	assert_non_null(strstr(refusal(&h), "local rank 2 is out of range for local size 2"));
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.nodes = 2;
	rank.value = 2;
	h.node_rank = &rank;
	assert_non_null(strstr(refusal(&h), "node rank 2 of 2 nodes is out of range"));
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.nodes = 2;
	assert_non_null(strstr(refusal(&h), "a job of several nodes needs its coordinator"));
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.nodes = 9;
	assert_non_null(strstr(refusal(&h), "9 nodes are more than this node serves a job of (--max-nodes 8)"));
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.nodes = 2;
	h.coordinator = "n0";
	struct gs_settings n, js;
	node(&n);
	n.node_port = 0;
	char err[400] = "";
	assert_int_equal(gs_job_settings_from_hello(&n, "x", &h, &js, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "this daemon serves jobs of one node only (--node-port 0)"));
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.local_size = 65;
	assert_non_null(strstr(refusal(&h), "local size 65 is more than 64"));
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.wire_dtype = (Gradsync__WireDtype)9;
	assert_non_null(strstr(refusal(&h), "wire dtype 9 or op 1 is unknown"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(unset_fields_are_not_compared),
		cmocka_unit_test(agreeing_fields_pass),
		cmocka_unit_test(each_difference_is_named),
		cmocka_unit_test(one_node_skips_the_coordinator),
		cmocka_unit_test(a_bare_hello_defines_the_defaults),
		cmocka_unit_test(the_first_hello_defines_the_job),
		cmocka_unit_test(limits_are_named),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
