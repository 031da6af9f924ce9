"""Distributed orthogonalization: the whole-tree plan and its execution on a mesh (docs/sharding.md).

* :mod:`~spectral_optax._distributed.plan`: who orthogonalizes what (the cost-balanced plan,
  :class:`~spectral_optax._distributed.plan.OrthogonalizationPlan`, its flops-per-byte figures);
* :mod:`~spectral_optax._distributed.execute`: the plan run on the updates' mesh (moves to the
  owners, split matrices under ``shard_map``, packs);
* :mod:`~spectral_optax._distributed.collectives`: the Gram all-reduce that sends upper triangles;
* :mod:`~spectral_optax._distributed.mesh`: mesh and layout helpers of every transform (the mesh
  in an array's type, ``Explicit`` specs, ``shard_map`` / ``pmap`` gathering).

Nothing is imported here, so that a module needing one helper does not load the others.
"""
