"""Distributed orthogonalization: the whole-tree plan and its execution on a mesh (docs/sharding.md).

* :mod:`~spectral_optax._distributed.plan`: who orthogonalizes what (the cost-balanced plan,
  :class:`~spectral_optax._distributed.plan.OrthogonalizationPlan`, its flops-per-byte figures);
* :mod:`~spectral_optax._distributed.execute`: the plan run on the updates' mesh (moves to the
  owners, split matrices under ``shard_map``, packs).

The collectives (:mod:`~spectral_optax._mesh.collectives`: the Gram all-reduce that sends upper triangles)
and the mesh and layout helpers of every transform (:mod:`~spectral_optax._mesh.layout`) sit below, in
``spectral_optax._mesh``, which the dual maps use too.

Nothing is imported here, so that a module needing one helper does not load the others.
"""
