/*
 * Helpers for integration tests: start the real gradsyncd and real trainer
 * processes, wait for them with deadlines, and talk raw protocol to the
 * daemon for the bad-input cases. Paths come from the environment that
 * meson sets: GS_DAEMON, GS_TRAINER, GS_CTL, GS_LAYOUTS.
 */
#ifndef GS_HARNESS_H
#define GS_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gradsync.pb-c.h"

struct gs_test_daemon {
	pid_t pid;
	char dir[64];     /* temporary directory of this daemon */
	char socket[108]; /* sizeof(sun_path) */
	char log[160];    /* its stderr */
};

/* The launcher variables libgradsync reads (GRADSYNC_* job and settings,
 * torchrun's, Slurm's; NULL ended); gradsyncd reads the settings among
 * them too. harness_clear_launch_env() unsets them in this process, whose
 * children inherit it; harness_daemon_spawn() does so first. */
extern const char *const harness_launch_vars[];
void harness_clear_launch_env(void);

/* Starts gradsyncd on a fresh socket with the extra arguments (NULL
 * ended) and waits until it accepts connections. Fails the test on error. */
void harness_daemon_start(struct gs_test_daemon *d, const char *const *args);
/* Starts gradsyncd without waiting for it (several nodes start together). */
void harness_daemon_spawn(struct gs_test_daemon *d, const char *const *args);
/* Waits until a spawned daemon accepts trainers, up to timeout_ms, and
 * has closed the connection that found it so (no fixed sleep needed
 * before counting its connections or descriptors). */
void harness_daemon_wait_ready(struct gs_test_daemon *d, int timeout_ms);
/* Whether something accepts connections on the Unix socket at path. */
bool harness_listening(const char *path);
/* Whether gradsyncd was built with Gloo, which a job of several nodes needs
 * (GS_HAVE_GLOO from meson). */
bool harness_have_gloo(void);
/* The exit status meson test reports as a skipped test. */
#define HARNESS_EXIT_SKIP 77
/* A TCP port on 127.0.0.1 that was free a moment ago. */
int harness_free_port(void);

/* The resident memory of process pid (VmRSS), in KiB. Fails the test
 * when it cannot be read. */
long harness_rss_kib(pid_t pid);
/* How often the threads of process pid named name went to sleep (their
 * voluntary context switches, summed). Fails the test when none is. */
long harness_thread_sleeps(pid_t pid, const char *name);

/* SIGTERM, then waits (SIGKILL after 10 s); returns its exit status. */
int harness_daemon_stop(struct gs_test_daemon *d);
/* True while the daemon process runs. */
bool harness_daemon_alive(const struct gs_test_daemon *d);
/* Whether the daemon's log contains text. */
bool harness_log_contains(const struct gs_test_daemon *d, const char *text);
/* Whether a file (a process's log) contains text. */
bool harness_file_contains(const char *path, const char *text);
/* Seconds on the monotonic clock, for measuring how long things take. */
double harness_now_s(void);
/* Waits until text shows in the file (a process's log); returns the
 * seconds it took. Dumps the file and fails the test past limit_s. */
double harness_wait_for_text(const char *path, const char *text, double limit_s);

/* Elements of layout file `name` (harness_layout), counted here and not
 * by the code under test. */
uint64_t harness_layout_elements(const char *name);

/* Asks the daemon on socket for its status on a new connection; returns
 * the seconds the answer took. Fails the test when there is none. */
double harness_status_seconds(const char *socket);

/* Waits (up to 120 s) until the daemon's status says its job is in step
 * `step`; fails the test past that. */
void harness_wait_in_step(const struct gs_test_daemon *d, uint64_t step);

/* Waits (up to 120 s) until the daemon's status lists trainer pid as
 * registered (idle or in a step); fails the test past that, showing the
 * daemon's log. */
void harness_wait_registered(const struct gs_test_daemon *d, pid_t pid);

/* Starts a program with argv (argv[0] is the path), output to log. */
pid_t harness_spawn(const char *const *argv, const char *log);
/* Waits for pid up to timeout_ms; kills it and fails the test past that.
 * Returns the exit status (or 128 + signal). */
int harness_wait(pid_t pid, int timeout_ms);

/* The path of a layout file shipped in layouts/. */
const char *harness_layout(const char *name);
/* Prints a file to stderr, for failures. */
void harness_dump(const char *path);
/* Fails the test unless the n logs hold the same lines that begin with
 * prefix, at least one: the verifying trainers' "NORM " lines, every
 * step's gradient norm in hex, the same bits on every trainer and node. */
void harness_expect_same_lines(const char *const *logs, size_t n, const char *prefix);

/* ---- The job ------------------------------------------------------------ */

#define HARNESS_MAX_NODES 4

/* A job as its trainers carry it, in libgradsync's environment (GRADSYNC_*,
 * client/launch.c): each test describes its job once, here, and every
 * trainer it starts gets it through harness_job_spawn() (or, in this
 * process, harness_job_setenv(), or raw_hello_job()). The job's first
 * trainer defines it; a field left unset (NULL, or 0 for the counts)
 * takes the default (local size 1, nodes 1, node rank 0, threshold
 * 2097152, wire fp16, op average, predivide world, fusion buffer 4194304).
 * The daemons get none of it: only, for a job of several nodes, where the
 * others reach them. Strings are the variables' values ("bf16",
 * "world"). */
struct harness_job {
	const char *id;                         /* GRADSYNC_JOB_ID */
	unsigned nodes;                         /* GRADSYNC_NODES */
	unsigned local_size[HARNESS_MAX_NODES]; /* GRADSYNC_LOCAL_SIZE of node r's trainers */
	/* GRADSYNC_COORDINATOR, the host of node 0's daemon; NULL: its
	 * address, harness_node_host(0), when the job has several nodes. */
	const char *coordinator;
	/* The port every daemon of the job listens on for the others
	 * (--node-port; node 0 serves the job's rendezvous there). 0: a free
	 * one, picked when the first daemon is started. */
	int port;
	const char *threshold;     /* GRADSYNC_THRESHOLD */
	const char *wire;          /* GRADSYNC_WIRE */
	const char *op;            /* GRADSYNC_OP */
	const char *predivide;     /* GRADSYNC_PREDIVIDE */
	const char *fusion_buffer; /* GRADSYNC_FUSION_BUFFER */
};

/* Strings built here (arguments, variables) and their NULL-ended list. */
#define HARNESS_STRS_MAX 32
struct harness_strs {
	char buf[HARNESS_STRS_MAX][200];
	const char *v[HARNESS_STRS_MAX + 1];
	size_t n;
};
void harness_strs_printf(struct harness_strs *s, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Appends copies of a NULL-ended list (NULL: nothing). */
void harness_strs_append(struct harness_strs *s, const char *const *list);

/* The variables (NAME=value) that carry the job to a trainer of node
 * `node`: only the fields the job sets. */
void harness_job_env(const struct harness_job *j, unsigned node, struct harness_strs *env);
/* The loopback address of node `node`'s daemon: 127.0.0.<node + 1>. */
const char *harness_node_host(unsigned node);
/* A daemon's flags as node `node` of a job of several nodes:
 * --node-address=harness_node_host(node) --node-port=<the job's port>. */
void harness_node_flags(const struct harness_job *j, unsigned node, struct harness_strs *flags);
/* The flags of node `node`'s daemon of the job (the node flags, for a job
 * of several nodes), then extra (NULL ended, or NULL). Picks the job's
 * port when it has none. */
void harness_job_daemon_flags(struct harness_job *j, unsigned node, const char *const *extra,
			      struct harness_strs *flags);
/* harness_daemon_spawn / _start for node `node` of the job. */
void harness_job_daemon_spawn(struct gs_test_daemon *d, struct harness_job *j, unsigned node,
			      const char *const *extra);
void harness_job_daemon_start(struct gs_test_daemon *d, struct harness_job *j, unsigned node,
			      const char *const *extra);

/* Starts node `node`'s daemon of the job again, on old's socket path (the
 * stale socket file is replaced) and in its folder, logging to
 * gradsyncd-2.log there; returns once it is ready, in *d. */
void harness_job_daemon_restart(struct gs_test_daemon *d, const struct gs_test_daemon *old,
				struct harness_job *j, unsigned node, const char *const *extra);

/* harness_spawn with the variables env (NAME=value, NULL ended) set in
 * the child only. */
pid_t harness_spawn_env(const char *const *argv, const char *const *env, const char *log);
/* Starts a trainer of node `node` of the job: argv with the job's
 * variables set in the child. */
pid_t harness_job_spawn(const struct harness_job *j, unsigned node, const char *const *argv,
			const char *log);
/* Sets the job's variables of node `node` in this process (after the
 * daemon started: harness_daemon_spawn clears them), for trainers it
 * connects itself; harness_clear_launch_env() unsets them. */
void harness_job_setenv(const struct harness_job *j, unsigned node);

/* ---- Raw protocol ------------------------------------------------------ */

/* A connected socket to the daemon (blocking, 10 s receive timeout). */
int raw_connect(const char *socket);
/* Closes a raw connection and waits (up to 10 s, else fails the test)
 * until gradsyncd has closed its end too: what the connection held (a
 * local rank, parked descriptors, mappings) is then released. */
void raw_close(int fd);
/* Sends a message with optional descriptors. */
void raw_send(int fd, const Gradsync__Message *m, const int *fds, size_t nfds);
void raw_send_bytes(int fd, const void *data, size_t len);
/* Receives one message; NULL on end of stream or timeout. */
Gradsync__Message *raw_recv(int fd);
/* Sends a trainer's Hello (this process's pid) of local rank `rank`,
 * protocol version `version` and job id `job`, without waiting for the
 * answer. */
void raw_send_hello(int fd, uint64_t rank, uint64_t version, const char *job);
/* Hello as a trainer of local rank `rank`; asserts a Welcome comes back. */
void raw_hello(int fd, uint32_t rank);
/* raw_send_hello with the job's view of node `node` in the Hello, as
 * libgradsync sends it from harness_job_env()'s variables. */
void raw_send_hello_job(int fd, uint64_t rank, uint64_t version, const struct harness_job *j,
			unsigned node);
/* raw_hello as a trainer of node 0 of the job (job id, local size,
 * settings in the Hello): for a job of more than one trainer, or one
 * whose settings are not the defaults. */
void raw_hello_job(int fd, uint32_t rank, const struct harness_job *j);
/* Expects an Error whose message contains `text` with the given code,
 * then the end of the stream. */
void raw_expect_error(int fd, int code, const char *text);
/* A sealed memfd of `size` bytes (seals: shrink, grow, seal). */
int make_memfd(size_t size, bool sealed);

#endif
