/*
 * Prints the size and field offsets of every public struct of gradsync.h as
 * JSON, as the C compiler lays them out, for test_abi.py to compare with
 * the Python binding's ctypes mirrors. `abi-dump constants` prints instead
 * the values of the enums and numeric macros the binding copies, by their
 * C names.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gradsync.h"

static int first_struct = 1, first_field;

static void begin(const char *name, size_t size)
{
	printf("%s\"%s\": {\"size\": %zu, \"fields\": {", first_struct ? "" : ", ", name, size);
	first_struct = 0;
	first_field = 1;
}

static void field(const char *name, size_t offset)
{
	printf("%s\"%s\": %zu", first_field ? "" : ", ", name, offset);
	first_field = 0;
}

static void end(void)
{
	printf("}}");
}

#define BEGIN(s) begin(#s, sizeof(struct s))
#define F(s, f) field(#f, offsetof(struct s, f))

static int first_constant = 1;

static void constant(const char *name, unsigned long long value)
{
	printf("%s\"%s\": %llu", first_constant ? "" : ", ", name, value);
	first_constant = 0;
}

#define C(name) constant(#name, (unsigned long long)(name))

/* Every enumerator of enum gs_dtype, gs_wire_dtype and gs_reduce_op (the
 * test checks this list against the header's text, so that a new one
 * cannot be left out), and the macros _lib.py writes as numbers. */
static int dump_constants(void)
{
	printf("{");
	C(GS_FLOAT32); C(GS_FLOAT16); C(GS_BFLOAT16); C(GS_FLOAT64);
	C(GS_INT32); C(GS_INT64); C(GS_UINT8);
	C(GS_WIRE_DTYPE_FP16); C(GS_WIRE_DTYPE_BF16); C(GS_WIRE_DTYPE_FP32);
	C(GS_OP_AVERAGE); C(GS_OP_SUM);
	C(GS_FROM_ENV); C(GS_FROM_ENV_U64); C(GS_LAUNCH_SOURCE_MAX);
	printf("}\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "constants") == 0)
		return dump_constants();
	printf("{");
	BEGIN(gs_connect_options);
	F(gs_connect_options, size); F(gs_connect_options, socket_path);
	F(gs_connect_options, local_rank); F(gs_connect_options, job_id);
	F(gs_connect_options, timeout_ms); F(gs_connect_options, local_size);
	F(gs_connect_options, nodes); F(gs_connect_options, node_rank);
	F(gs_connect_options, coordinator); F(gs_connect_options, threshold);
	F(gs_connect_options, wire_dtype); F(gs_connect_options, op);
	F(gs_connect_options, predivide_factor); F(gs_connect_options, fusion_buffer_elements);
	end();
	BEGIN(gs_launch_info);
	F(gs_launch_info, size); F(gs_launch_info, job_id); F(gs_launch_info, job_id_source);
	F(gs_launch_info, local_rank); F(gs_launch_info, local_rank_source);
	F(gs_launch_info, local_size); F(gs_launch_info, local_size_source);
	F(gs_launch_info, nodes); F(gs_launch_info, nodes_source);
	F(gs_launch_info, node_rank); F(gs_launch_info, node_rank_source);
	F(gs_launch_info, coordinator); F(gs_launch_info, coordinator_source);
	F(gs_launch_info, threshold); F(gs_launch_info, threshold_source);
	F(gs_launch_info, wire_dtype); F(gs_launch_info, wire_dtype_source);
	F(gs_launch_info, op); F(gs_launch_info, op_source);
	F(gs_launch_info, predivide_factor); F(gs_launch_info, predivide_source);
	F(gs_launch_info, fusion_buffer_elements); F(gs_launch_info, fusion_buffer_source);
	end();
	BEGIN(gs_session_info);
	F(gs_session_info, world_size); F(gs_session_info, local_size);
	F(gs_session_info, node_rank); F(gs_session_info, nodes);
	F(gs_session_info, backend); F(gs_session_info, daemon_version);
	F(gs_session_info, threshold); F(gs_session_info, wire_dtype);
	F(gs_session_info, op); F(gs_session_info, predivide_factor);
	F(gs_session_info, fusion_buffer_elements); F(gs_session_info, global_rank);
	F(gs_session_info, local_rank);
	end();
	BEGIN(gs_tensor_spec);
	F(gs_tensor_spec, name); F(gs_tensor_spec, count); F(gs_tensor_spec, dtype);
	F(gs_tensor_spec, memfd); F(gs_tensor_spec, offset);
	end();
	BEGIN(gs_cuda_tensor_spec);
	F(gs_cuda_tensor_spec, name); F(gs_cuda_tensor_spec, count);
	F(gs_cuda_tensor_spec, dtype); F(gs_cuda_tensor_spec, data);
	end();
	BEGIN(gs_step_options);
	F(gs_step_options, size); F(gs_step_options, clipping);
	F(gs_step_options, clip_value); F(gs_step_options, bucket_events);
	end();
	BEGIN(gs_step_result);
	F(gs_step_result, step); F(gs_step_result, status); F(gs_step_result, buckets);
	F(gs_step_result, wire_bytes); F(gs_step_result, clipped);
	F(gs_step_result, nonfinite); F(gs_step_result, duration_ns);
	F(gs_step_result, grad_norm);
	end();
	BEGIN(gs_trainer_status);
	F(gs_trainer_status, pid); F(gs_trainer_status, uid);
	F(gs_trainer_status, local_rank); F(gs_trainer_status, tensors);
	F(gs_trainer_status, bytes); F(gs_trainer_status, steps);
	F(gs_trainer_status, state);
	end();
	BEGIN(gs_peer_status);
	F(gs_peer_status, node_rank); F(gs_peer_status, local_size);
	F(gs_peer_status, host); F(gs_peer_status, state);
	end();
	BEGIN(gs_status);
	F(gs_status, daemon_version); F(gs_status, backend); F(gs_status, isa);
	F(gs_status, job_state); F(gs_status, job_id); F(gs_status, uptime_ns);
	F(gs_status, settings); F(gs_status, local_size); F(gs_status, world_size);
	F(gs_status, node_rank); F(gs_status, nodes); F(gs_status, buckets);
	F(gs_status, current_step); F(gs_status, buckets_in_flight);
	F(gs_status, steps_completed); F(gs_status, steps_aborted);
	F(gs_status, last_step_ns); F(gs_status, median_step_ns);
	F(gs_status, bytes_reduced); F(gs_status, elements_clipped);
	F(gs_status, nonfinite); F(gs_status, trainer_count); F(gs_status, trainers);
	F(gs_status, internode_bytes); F(gs_status, peer_count); F(gs_status, peers);
	F(gs_status, job_hidden); F(gs_status, hidden_trainers);
	F(gs_status, job_count); F(gs_status, jobs); F(gs_status, max_jobs);
	end();
	BEGIN(gs_job_status);
	F(gs_job_status, job_id); F(gs_job_status, hidden); F(gs_job_status, owner_uid);
	F(gs_job_status, state); F(gs_job_status, local_size); F(gs_job_status, nodes);
	F(gs_job_status, node_rank); F(gs_job_status, world_size);
	F(gs_job_status, coordinator); F(gs_job_status, threshold);
	F(gs_job_status, wire_dtype); F(gs_job_status, op);
	F(gs_job_status, predivide_factor); F(gs_job_status, fusion_buffer_elements);
	F(gs_job_status, backend); F(gs_job_status, trainers_connected);
	F(gs_job_status, trainer_count); F(gs_job_status, trainers);
	F(gs_job_status, buckets); F(gs_job_status, buckets_in_flight);
	F(gs_job_status, current_step); F(gs_job_status, steps_completed);
	F(gs_job_status, steps_aborted); F(gs_job_status, last_step_ns);
	F(gs_job_status, median_step_ns); F(gs_job_status, group_generation);
	F(gs_job_status, groups_built); F(gs_job_status, age_ns);
	F(gs_job_status, internode_bytes); F(gs_job_status, peer_count);
	F(gs_job_status, peers);
	end();
	BEGIN(gs_connection_status);
	F(gs_connection_status, id); F(gs_connection_status, role);
	F(gs_connection_status, pid); F(gs_connection_status, uid);
	F(gs_connection_status, gid); F(gs_connection_status, self);
	F(gs_connection_status, local_rank); F(gs_connection_status, state);
	F(gs_connection_status, tensors); F(gs_connection_status, bytes);
	F(gs_connection_status, steps); F(gs_connection_status, hidden);
	end();
	BEGIN(gs_trace_status);
	F(gs_trace_status, active); F(gs_trace_status, events);
	F(gs_trace_status, bytes); F(gs_trace_status, dropped);
	F(gs_trace_status, path); F(gs_trace_status, error);
	end();
	BEGIN(gs_state_spec);
	F(gs_state_spec, name); F(gs_state_spec, bytes); F(gs_state_spec, dtype);
	F(gs_state_spec, memfd); F(gs_state_spec, offset);
	end();
	BEGIN(gs_cuda_state_spec);
	F(gs_cuda_state_spec, name); F(gs_cuda_state_spec, bytes);
	F(gs_cuda_state_spec, dtype); F(gs_cuda_state_spec, data);
	end();
	BEGIN(gs_state_result);
	F(gs_state_result, size); F(gs_state_result, bytes);
	F(gs_state_result, duration_ns); F(gs_state_result, tensors_done);
	end();
	printf("}\n");
	return 0;
}
