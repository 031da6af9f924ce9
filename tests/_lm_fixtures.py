"""Small decoder LMs in the style of google-deepmind/nanodo's ``model.py``: the lab's :class:`spectral_optax.lab.Decoder`.

``TiedDecoder``: learned positions, pre-norm blocks with ``DenseGeneral``
attention heads, logits by the tied ``embed.attend``. ``UntiedDecoder``: the
same with a separate ``Dense`` head.
"""

from __future__ import annotations

from spectral_optax.lab import Decoder


class TiedDecoder(Decoder):
    pass


class UntiedDecoder(Decoder):
    tied: bool = False
