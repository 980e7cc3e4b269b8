"""A writable store's loops (dispatch, flush, cleanup), their channels and worker processes."""
