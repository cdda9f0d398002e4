/*
 * release.c: giving back every byte of device memory the model holds
 * (dense tensors, activations, the KV pool: the blocks that sequences hold
 * copied to host memory first) and taking it again, bitwise the same.
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
	uint32_t held = m->n_blocks - m->n_free;
	if (m->kv && held) {
		/* keep the sequences: the blocks they hold, every layer's K and V */
		const uint64_t half = BATON_KV_BLOCK * kv_row(m), bb = model_kv_block_bytes(m);
		uint8_t *save = malloc(held * bb);
		uint32_t *ids = malloc(held * sizeof *ids), k = 0;
		if (!save || !ids) {
			free(save);
			free(ids);
			return BATON_ENOMEM;
		}
		for (struct baton_seq *s = m->seqs; s; s = s->next)
			for (uint32_t b = 0; b < s->n_blocks; b++)
				ids[k++] = s->blocks[b];
		if ((rc = m->be->sync(m->dev)) != 0)
			goto fail;
		for (uint32_t b = 0; b < k; b++)
			for (uint32_t l = 0; l < m->cfg.layers; l++) {
				uint8_t *dst = save + b * bb + (uint64_t)l * 2 * half;
				uint64_t at = (uint64_t)ids[b] * half;
				if ((rc = m->be->copy_d2h(m->dev, dst, kv_k(m, l) + at, half)) ||
				    (rc = m->be->copy_d2h(m->dev, dst + half, kv_v(m, l) + at, half)))
					goto fail;
			}
		kv_drop_saved(m);
		m->kv_saved = save;
		m->saved_ids = ids;
		m->n_saved = k;
		goto saved;
fail:
		free(save);
		free(ids);
		return rc;
	}
saved:
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
	if (m->n_saved) {
		const uint64_t half = BATON_KV_BLOCK * kv_row(m), bb = model_kv_block_bytes(m);
		const uint8_t *save = m->kv_saved;
		if ((rc = kv_ensure(m)) != 0)
			goto fail;
		for (uint32_t b = 0; b < m->n_saved; b++)
			for (uint32_t l = 0; l < m->cfg.layers; l++) {
				const uint8_t *src = save + b * bb + (uint64_t)l * 2 * half;
				uint64_t at = (uint64_t)m->saved_ids[b] * half;
				struct baton_copy c[2] = {
					{ .dst = kv_k(m, l) + at, .src = src, .bytes = half },
					{ .dst = kv_v(m, l) + at, .src = src + half, .bytes = half },
				};
				if ((rc = m->be->copy_h2d(m->dev, c, 2)) != 0)
					goto fail;
			}
	}
	if ((rc = m->be->sync(m->dev)) != 0)
		goto fail;
	kv_drop_saved(m);
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
