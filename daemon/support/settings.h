/*
 * gradsyncd's settings. One table (settings.c) drives the command-line
 * flags, the GRADSYNC_* environment variables, the configuration file
 * (gradsync.conf(5)), --help, --print-config and the example file, so they
 * cannot drift apart. A flag beats the environment, which beats the file,
 * which beats the default.
 */
#ifndef GS_SETTINGS_H
#define GS_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "client_protocol.h"
#include "convert.h"
#include "support/secret.h"

/* Read at start unless --config or GRADSYNC_CONFIG say otherwise; the
 * build sets it from its sysconfdir. */
#ifndef GS_DEFAULT_CONFIG
#define GS_DEFAULT_CONFIG "/etc/gradsync/gradsyncd.conf"
#endif

enum gs_reduce { GS_REDUCE_AVERAGE = 1, GS_REDUCE_SUM = 2 };
enum gs_backend_choice { GS_BACKEND_AUTO = 0, GS_BACKEND_HOST = 1, GS_BACKEND_CUDA = 2 };
/* Who may join a job besides root: its owner (the uid of its first
 * trainer), or anyone allowed on the socket (a node of one tenant). */
enum gs_job_access { GS_JOB_ACCESS_OWNER = 0, GS_JOB_ACCESS_ANY = 1 };

struct gs_settings {
	char config_path[256];  /* the configuration file; "": none */
	char socket_path[108]; /* sizeof(sun_path) */
	int backend;              /* enum gs_backend_choice */
	int log_level;            /* enum gs_log_level */
	uint64_t max_frame;       /* bytes */
	uint64_t max_tensors;     /* per trainer */
	uint64_t max_bytes;       /* registered per trainer */
	int allow_hugetlb;        /* accept MFD_HUGETLB memfds (0 or 1) */
	char node_address[256];   /* where other daemons reach this one; "": the host name */
	uint32_t node_port;       /* the rendezvous of every job whose node 0 this is */
	char cluster_secret_file[256]; /* "": the rendezvous is unauthenticated */
	uint64_t join_timeout;    /* seconds to wait for the other nodes */
	uint64_t peer_timeout;    /* seconds an all-reduce may wait on a peer */
	uint64_t auth_timeout;    /* seconds a rendezvous peer may take to authenticate */
	uint64_t step_timeout;    /* seconds a step may wait for gradients */
	uint64_t stall_warning;   /* seconds before naming what a step waits for */
	char group[64];           /* owns the socket; its members may connect */
	char allow_uids[256];     /* more users that may connect, "1000,1001" */
	uint64_t max_clients;     /* connections at once */
	int job_access;           /* enum gs_job_access */
	uint64_t hello_timeout;   /* seconds a new connection has to say Hello */
	uint64_t frame_timeout;   /* seconds a started frame has to arrive whole */
	uint64_t register_timeout; /* seconds a welcomed trainer has to register */
	uint64_t max_pending_bytes; /* buffered by every client's reader together */
	uint64_t max_queued_bytes; /* queued to write to one client */
	uint64_t max_parked_fds;  /* received, not yet claimed, every client together */
	uint64_t max_buffers;     /* separate buffers (mappings) per trainer */
	uint64_t max_mappings;    /* buffers of every trainer together */
	uint64_t max_jobs;        /* jobs at once */
	uint64_t max_trainers;    /* trainers of every job together */
	uint64_t max_jobs_per_user;     /* jobs of one owner; 0: no limit */
	uint64_t max_trainers_per_user; /* trainers of one uid; 0: no limit */
	uint32_t max_nodes;       /* most nodes one job may span */
	uint64_t max_fusion_elements; /* the largest fusion buffer a job may ask for */
	uint64_t max_fusion_memory; /* bytes of every job's fusion buffers together */
	uint64_t job_linger;      /* seconds a job's group outlives its trainers */
	char gpus[256];           /* PCI bus ids the CUDA backend may use; "": all */

	/* The job's, not the node's: no flag sets them. Each job has its own
	 * copy of the node's settings with these filled in from its first
	 * trainer's Hello (engine/job_view.c); the node's copy leaves them 0. */
	char job_id[GS_JOB_ID_MAX + 1];
	uint32_t local_size;
	uint64_t threshold;       /* elements */
	int wire;                 /* enum gs_wire */
	int op;                   /* enum gs_reduce */
	double predivide;         /* 0: the world size */
	uint64_t fusion_elements; /* per fusion buffer */
	uint32_t nodes;
	uint32_t node_rank;
	char coordinator[GS_COORDINATOR_MAX + 16]; /* HOST:PORT of node rank 0's rendezvous */
	char gloo_host[256];      /* where this node's Gloo device listens: node_address */
	/* The user whose trainer began the job here, for its whole life
	 * (engine/ownership.h). */
	uid_t owner;

	/* Not settings of the table: the secret read from
	 * cluster_secret_file at start (len 0: none). */
	uint8_t cluster_secret[GS_SECRET_MAX];
	size_t cluster_secret_len;
};

enum gs_settings_result {
	GS_SETTINGS_RUN = 0,
	GS_SETTINGS_EXIT_OK = 1,    /* --help, --version, --print-config, --print-example-config */
	GS_SETTINGS_EXIT_USAGE = 2, /* message already printed */
};

/* Fills *s from defaults, environment and argv; prints --help, --version,
 * --print-config output or the reason a value is refused (naming the
 * setting and its allowed range). To run, it also reads the cluster
 * secret, refusing a file that is missing, too short or open to others. */
enum gs_settings_result gs_settings_load(struct gs_settings *s, int argc,
					 char **argv);

/* --allow-uids as user ids: at most GS_MAX_ALLOW_UIDS of 0 to 2^32-2.
 * Returns 0, or -EINVAL with why. */
#define GS_MAX_ALLOW_UIDS 64
int gs_settings_allow_uids(const struct gs_settings *s, uid_t *uids, size_t *n,
			   char *why, size_t whylen);

/* The names of a wire dtype and a reduce op, as the settings spell them
 * ("fp16", "average"); "unknown" for another value. */
const char *gs_wire_setting_name(int wire);
const char *gs_op_setting_name(int op);

/* A predivide factor as a trainer gives it: "world" for 0, else the
 * number ("2", "1.5"). */
void gs_predivide_text(double factor, char *out, size_t n);

/* The settings every node of a job must share, as text ("threshold=...
 * wire=... "), compared at the rendezvous. */
void gs_settings_shared_text(const struct gs_settings *s, char *out, size_t n);

/* The derived scale factors for a world of `world` ranks: gradients are
 * multiplied by *pre before the cast and by *post after the reduce. */
void gs_settings_scales(const struct gs_settings *s, uint32_t world,
			double *pre, double *post);

/* The effective predivide factor for a world of `world` ranks. */
double gs_settings_predivide(const struct gs_settings *s, uint32_t world);

#endif
