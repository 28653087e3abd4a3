/*
 * Whose a job is. A job belongs to the user whose trainer began it, for
 * its whole life on this node: while it joins its nodes, runs, waits for
 * a trainer that died to be replaced, lingers between trainers, and when
 * its owner begins it anew. A multi-node job is its node 0's owner's: the
 * other nodes' jobs must be the same user's (nodes of one cluster share
 * user ids, as Slurm and NFS homes assume).
 *
 * Every door into a job asks this one rule, and nothing else decides:
 * a trainer's Hello to a job this node has (engine/job.c), which covers
 * a lingering job's return; and a node's claim of a rank at the job's
 * rendezvous, first join or rejoin alike (cluster/rendezvous_server.c).
 */
#ifndef GS_OWNERSHIP_H
#define GS_OWNERSHIP_H

#include <stdbool.h>
#include <sys/types.h>

/* Whether the trainers of user `uid` may take part in a job that `owner`
 * began, under the node's --job-access (enum gs_job_access): the owner
 * and root may, and under "any" every user let onto the socket. */
bool gs_owner_admits(uid_t owner, int job_access, uid_t uid);

#endif
