/*
 * release.c: giving back every byte of device memory the model holds
 * (dense tensors, activations, the KV pool: the blocks that sequences hold
 * and, up to the host bound, the prefix cache's, copied to host memory
 * first, prefix.c's kv_save) and taking it again, bitwise the same.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/model/model_int.h"

int model_release(struct baton_model *m)
{
	int rc;

	if (!m)
		return BATON_EINVAL;
	if (m->released)
		return 0;
	/* keep the sequences (every block they hold) and as much of the
	 * prefix cache as host_limit allows, hottest first */
	if ((rc = kv_save(m)) != 0)
		return rc;
	if (m->kv)
		m->be->free(m->dev, m->kv);
	m->kv = 0;
	m->kv_bytes = 0;
	weights_free(m);
	m->released = 1;
	return 0;
}

int model_refill(struct baton_model *m)
{
	int rc;

	if (!m)
		return BATON_EINVAL;
	if (!m->released)
		return 0;
	for (uint32_t i = 0; i < m->n_ups; i++)
		if ((rc = weights_upload(m, &m->ups[i])) != 0)
			goto fail;
	if (m->cfg.tie_embeddings)
		m->head = m->embed;
	if ((rc = weights_alloc_acts(m)) != 0)
		goto fail;
	if ((rc = m->be->sync(m->dev)) != 0)
		goto fail;
	/* the saved blocks come back (last: a failure keeps them saved) */
	if (m->n_saved && (rc = kv_ensure(m)) != 0)
		goto fail;
	m->released = 0;
	return 0;
fail:
	/* nothing half-made stays: released as before, the sequences kept */
	if (m->kv)
		m->be->free(m->dev, m->kv);
	m->kv = 0;
	m->kv_bytes = 0;
	weights_free(m);
	return rc;
}

int model_released(const struct baton_model *m)
{
	return m->released;
}

uint64_t model_device_bytes(const struct baton_model *m)
{
	if (m->released)
		return 0;
	return m->dense_bytes + m->kv_bytes + (m->act_base ? m->act_bytes : 0);
}
