/*
 * A trainer's state (its parameters and buffers, raw bytes of any dtype)
 * registered beside its gradients, and the broadcast that makes every
 * local trainer's state bit for bit equal to one trainer's.
 *
 * The layout of state is kept as a gradient layout is (layout.h), with
 * "name (dtype)" for each name and its bytes for the count, so that the
 * same comparison names the first difference. The broadcast is a
 * collective of the node's trainers: once each has asked, with the same
 * source and tensors, the worker thread copies the source's bytes into
 * every other trainer's mapping (backend copy_bytes), and each is answered.
 */
#ifndef GS_STATE_H
#define GS_STATE_H

#include "engine/state_events.h"
#include "engine/trainer_state.h"
#include "gradsync.pb-c.h"

struct gs_job;
struct gs_trainer;

/* Handles one RegisterState frame; answers StateRegistered after the
 * last, or drops the client with an Error naming what is wrong. */
void gs_state_register(struct gs_trainer *t, const Gradsync__RegisterState *r);

/* Handles a trainer's BroadcastState: the broadcast starts once every
 * local trainer has asked; each is answered with StateBroadcastDone. */
void gs_state_broadcast_ask(struct gs_trainer *t, const Gradsync__BroadcastState *b);
/* A trainer left: a broadcast waiting for it fails, naming it. */
void gs_state_trainer_left(struct gs_job *j, struct gs_trainer *t);

#endif
