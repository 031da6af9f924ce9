"""The lowest package: what every layer may use on a mesh, importing nothing of the package above it.

* :mod:`~spectral_optax._mesh.layout`: mesh and layout helpers of every transform (the mesh in an array's
  type, ``Explicit`` specs, ``shard_map`` / ``pmap`` gathering);
* :mod:`~spectral_optax._mesh.collectives`: the Gram all-reduce that sends upper triangles
  (:func:`~spectral_optax._mesh.collectives.psum_symmetric`), used by the Newton-Schulz iteration and the
  distributed plan alike.

Nothing is imported here, so that a module needing one helper does not load the other.
"""
