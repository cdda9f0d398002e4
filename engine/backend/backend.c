/*
 * backend.c: the bottom of engine/backend/: the backend_* wrappers of
 * backend.h, which check an optional slot once so that callers never test
 * a slot for NULL (as ggml-backend does).
 */
#include "engine/backend/backend.h"

int backend_has_peer(const struct baton_backend *be)
{
	return be->map_peer && be->unmap_peer;
}

int backend_peer_access(const struct baton_backend *be, struct baton_dev *dev,
    struct baton_dev *peer)
{
	if (!backend_has_peer(be))
		return BATON_EUNSUPPORTED;
	return be->peer_access ? be->peer_access(dev, peer) : 0;
}

int backend_map_peer(const struct baton_backend *be, struct baton_dev *dev,
    struct baton_dev *peer, baton_dptr addr, uint64_t bytes)
{
	return be->map_peer ? be->map_peer(dev, peer, addr, bytes) : BATON_EUNSUPPORTED;
}

int backend_unmap_peer(const struct baton_backend *be, struct baton_dev *dev,
    struct baton_dev *peer, baton_dptr addr, uint64_t bytes)
{
	return be->unmap_peer ? be->unmap_peer(dev, peer, addr, bytes) : BATON_EUNSUPPORTED;
}

int backend_host_register(const struct baton_backend *be, struct baton_dev *dev,
    const void *p, uint64_t bytes)
{
	return be->host_register ? be->host_register(dev, p, bytes) : 0;
}

int backend_host_unregister(const struct baton_backend *be, struct baton_dev *dev,
    const void *p, uint64_t bytes)
{
	return be->host_unregister ? be->host_unregister(dev, p, bytes) : 0;
}

int backend_has_copy_d2d(const struct baton_backend *be)
{
	return be->copy_d2d != NULL;
}

int backend_copy_d2d(const struct baton_backend *be, struct baton_dev *dev, baton_dptr dst,
    baton_dptr src, uint64_t bytes)
{
	return be->copy_d2d ? be->copy_d2d(dev, dst, src, bytes) : BATON_EUNSUPPORTED;
}
