/*
 * The version of the protocol between daemons (the rendezvous: NodeAuth,
 * NodeHello and what follows), apart from the trainers' protocol
 * (GS_PROTOCOL_VERSION in gradsync.h), so that a change between daemons
 * does not turn away trainers linked against an older libgradsync.
 *
 *   1  the rendezvous of the first release candidates
 *   2  mutual authentication before anything else (NodeAuth, NodeChallenge,
 *      NodeProof) and the coordinator's incarnation id in its welcome
 *   3  the cuda backend's store keys (backend names, NCCL unique id) are
 *      the group's, "i<incarnation>/g<generation>/...", made again at
 *      each regroup; RegroupRequest, a node's word that its group failed
 *      with every node still there
 *   4  the host backend's all-reduce of every chunk carries the chunk's
 *      status after its gradients (daemon/chunk_status.h)
 *   5  Ping and Pong: each end of a rendezvous connection pings the other
 *      and takes silence for --peer-timeout as the other's loss; a second
 *      claim to a rank is settled by pinging its holder; refusals that may
 *      pass say GS_EAGAIN, and the node tries again
 *   6  One node port serves every job's rendezvous: NodeAuth names the
 *      job (job_id), and a job whose node 0 has no trainer yet is refused
 *      with GS_EAGAIN
 *   7  the host backend's all-reduces go in pipeline slices: a bucket's
 *      first chunk begins with a head of 16384 elements, and the rest goes
 *      in slices of the size node 0 offers in the group's store
 *      ("host/pipeline-slice": 1048576 elements, or 0 for the rest in one);
 *      each has a status of 9 elements after it that carries, in the head,
 *      every node's vote to go on, no longer a collective of its own
 *   8  NodeHello says whose the job is on that node (owner_uid): node 0
 *      admits a node whose job is another user's only as one of its own
 *      trainers would be (engine/ownership.h); a NodeAuth naming a job
 *      that node 0 does not have is challenged as any other, and told
 *      that there is no such job only once it has proven the secret
 *   9  a bucket's vote carries, per member of the bucket, whether the
 *      node's trainers produced that tensor in the step (GradientsReady
 *      .absent): after the head's status on the host backend, after the
 *      vote's four elements on the cuda backend's group vote
 */
#ifndef GS_NODE_PROTOCOL_H
#define GS_NODE_PROTOCOL_H

#define GS_NODE_PROTOCOL_VERSION 9

#endif
