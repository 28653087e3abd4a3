#include "backend/cuda/buffer_desc.h"

#include <stdio.h>
#include <string.h>

#include "errors.h"

enum gs_buffer_kind gs_buffer_kind_of(const Gradsync__Buffer *m)
{
	if (m->cuda_ipc_handle.len > 0)
		return GS_BUFFER_CUDA;
	if (m->cuda_ready_event.len > 0 || m->cuda_done_event.len > 0)
		return GS_BUFFER_CUDA_EVENTS;
	return GS_BUFFER_MEMFD;
}

static int check_handle(const ProtobufCBinaryData *h, const char *what, char *err,
			size_t errlen)
{
	if (h->len == GS_CUDA_IPC_HANDLE_SIZE)
		return GS_OK;
	snprintf(err, errlen, "its %s has %zu bytes; a CUDA IPC handle has %d", what, h->len,
		 GS_CUDA_IPC_HANDLE_SIZE);
	return GS_EINVAL;
}

/* Printable and short: it goes into log lines and error messages. */
static int check_bus_id(const char *id, char *err, size_t errlen)
{
	size_t n = strlen(id);
	for (size_t i = 0; i < n && n <= GS_PCI_BUS_ID_MAX; i++)
		if (id[i] < 0x21 || id[i] > 0x7e)
			n = GS_PCI_BUS_ID_MAX + 1;
	if (n <= GS_PCI_BUS_ID_MAX)
		return GS_OK;
	snprintf(err, errlen, "its PCI bus id is not a short printable string");
	return GS_EINVAL;
}

static int parse_cuda(const Gradsync__Buffer *m, struct gs_buffer_desc *out, char *err,
		      size_t errlen)
{
	out->device = m->device;
	out->pci_bus_id = m->pci_bus_id ? m->pci_bus_id : "";
	if (m->device < 0) {
		snprintf(err, errlen, "it names CUDA device %d", (int)m->device);
		return GS_EINVAL;
	}
	int rc = check_bus_id(out->pci_bus_id, err, errlen);
	if (rc != GS_OK)
		return rc;
	if (out->kind == GS_BUFFER_CUDA) {
		if (m->cuda_ready_event.len > 0 || m->cuda_done_event.len > 0) {
			snprintf(err, errlen, "it carries both a CUDA memory handle and events");
			return GS_EINVAL;
		}
		if (m->size == 0) {
			snprintf(err, errlen, "a CUDA allocation of 0 bytes");
			return GS_EINVAL;
		}
		out->handle = m->cuda_ipc_handle.data;
		return check_handle(&m->cuda_ipc_handle, "memory handle", err, errlen);
	}
	if (m->size != 0) {
		snprintf(err, errlen, "a buffer of CUDA events has size %llu; it must be 0",
			 (unsigned long long)m->size);
		return GS_EINVAL;
	}
	rc = check_handle(&m->cuda_ready_event, "ready event", err, errlen);
	if (rc == GS_OK)
		rc = check_handle(&m->cuda_done_event, "done event", err, errlen);
	if (rc == GS_OK && m->n_cuda_ready_ring > GS_CUDA_READY_RING_MAX) {
		snprintf(err, errlen, "its ring has %zu ready events; at most %d", m->n_cuda_ready_ring,
			 GS_CUDA_READY_RING_MAX);
		rc = GS_EINVAL;
	}
	for (size_t i = 0; rc == GS_OK && i < m->n_cuda_ready_ring; i++) {
		rc = check_handle(&m->cuda_ready_ring[i], "ring's ready event", err, errlen);
		out->ready_ring[i] = m->cuda_ready_ring[i].data;
	}
	out->nring = m->n_cuda_ready_ring;
	out->ready_event = m->cuda_ready_event.data;
	out->done_event = m->cuda_done_event.data;
	return rc;
}

int gs_buffer_desc_parse(const Gradsync__Buffer *m, uint32_t rank, int fd,
			 struct gs_buffer_desc *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	out->kind = gs_buffer_kind_of(m);
	out->rank = rank;
	out->size = m->size;
	out->fd = fd;
	out->device = -1;
	out->pci_bus_id = "";
	if (out->kind == GS_BUFFER_MEMFD)
		return GS_OK;
	return parse_cuda(m, out, err, errlen);
}
