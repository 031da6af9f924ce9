"""Tune once, train longer and at a larger batch: hyperparameter transfer rules.

The parametrization (``mup_adamw``, ``muon``, ``moga``, ...) transfers the
learning rate across **width**, and :func:`~spectral_optax.depth_residual_scale`
across **depth**. A real "tune small, train big" run also changes the number
of training tokens, the batch size and with them the best weight decay and
Adam's ``beta2``; this module maps a proxy's tuned hyperparameters to a
target's for those axes only::

    from spectral_optax import transfer as st

    proxy = st.Scale(width=64, depth=2, steps=1_000, batch_size=32)
    target = st.Scale(width=512, depth=8, steps=8_000, batch_size=128)
    t = st.transfer({"learning_rate": 3e-3, "weight_decay": 0.1, "b2": 0.999, "warmup_steps": 50}, proxy, target)
    print(t)                      # every factor applied, rule by rule
    tx = so.mup_adamw(t.warmup_cosine(), base=base, weight_decay=t["weight_decay"], b2=t["b2"])

Width and depth are **never** applied here (they are in the account, marked
"not applied"): the optimizer's per-layer scaling and the residual scale
already move the per-layer learning rate; applying a width or depth rule on
top would apply it twice.

The rules (each a named factory returning a :class:`Rule`; the formulas are
in docs/math.md, "Transfer across horizon, batch size and weight decay"):

* :func:`horizon` -- ``eta ~ D^-a`` over training tokens ``D`` at a fixed
  batch, ``a = 0.32`` (Bjorck et al., arXiv:2409.19913).
* :func:`batch` -- ``eta ~ B^b`` over the batch size at fixed tokens,
  ``b = 0.62`` (Filatov et al., arXiv:2510.03871; ``b = 0.5`` is the
  square-root rule for Adam). Meant below the critical batch.
* :func:`weight_decay_timescale` -- the EMA timescale ``tau = 1 / (eta *
  lambda)`` kept a constant fraction of the run's steps (Wang & Aitchison,
  arXiv:2405.13698), so ``lambda' = lambda * eta T / (eta' T')`` with the
  *transferred* ``eta'``. The package's optimizers multiply the decay by the
  global learning rate (not the per-layer muP one), so ``tau`` does not
  depend on width.
* :func:`beta2_half_life` -- Adam's second-moment EMA keeps its half-life in
  examples: ``b2' = b2 ** (B' / B)`` (Marek et al., arXiv:2507.07101).
* :func:`warmup_fraction` -- warm-up steps stay a fixed fraction of the run.

Momentum (``b1`` / ``momentum``) has no rule and is kept.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

__all__ = [
    "BATCH_EXPONENT",
    "DEFAULT_RULES",
    "HORIZON_EXPONENT",
    "Factor",
    "Rule",
    "Scale",
    "Transfer",
    "batch",
    "beta2_half_life",
    "horizon",
    "transfer",
    "warmup_fraction",
    "weight_decay_timescale",
]

#: ``a`` in ``eta ~ D^-a`` (Bjorck et al., arXiv:2409.19913, AdamW; the same holds for Muon on the Frobenius sphere).
HORIZON_EXPONENT = 0.32
#: ``b`` in ``eta ~ B^b`` at fixed tokens (Filatov et al., arXiv:2510.03871).
BATCH_EXPONENT = 0.62

LR_KEYS = ("learning_rate",)
KNOWN_KEYS = ("learning_rate", "weight_decay", "b2", "beta2", "adam_b2", "b1", "momentum", "warmup_steps", "warmup")


# --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Scale:
    """The scale of one training run.

    Attributes:
      width: model width (reported only; the parametrization transfers it).
      depth: number of blocks (reported only; ``depth_residual_scale``
        transfers it).
      steps: optimizer steps of the run.
      batch_size: examples (sequences) per step.
      sequence_length: tokens per example (1 for a classifier), so that
        ``tokens = steps * batch_size * sequence_length``.
    """

    width: int | None = None
    depth: int | None = None
    steps: int | None = None
    batch_size: int | None = None
    sequence_length: int = 1

    def __post_init__(self):
        for f in ("width", "depth", "steps", "batch_size", "sequence_length"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"Scale.{f} must be a positive int or None, got {v!r}")

    @property
    def tokens(self) -> int | None:
        """``steps * batch_size * sequence_length`` (``None`` if steps or batch is unknown)."""
        if self.steps is None or self.batch_size is None:
            return None
        return self.steps * self.batch_size * self.sequence_length


@dataclasses.dataclass(frozen=True)
class Factor:
    """One factor applied to one hyperparameter: ``new = factor * old`` (or, for
    ``b2``, the power shown in ``formula``)."""

    rule: str
    key: str
    before: float
    after: float
    formula: str
    source: str

    @property
    def factor(self) -> float:
        return self.after / self.before if self.before else float("nan")


#: a rule's function: ``(proxy_hparams, current_hparams, proxy, target) -> {key: (new value, formula)}``.
RuleFn = Callable[[Mapping[str, float], Mapping[str, float], Scale, Scale], dict[str, tuple[float, str]]]


@dataclasses.dataclass(frozen=True)
class Rule:
    """A named transfer rule.

    Attributes:
      name: the rule's name (the key in ``transfer(rules=...)``).
      fn: ``(proxy_hparams, current_hparams, proxy, target) -> {key: (value,
        formula)}``; ``current_hparams`` holds the values after the rules
        before it (the weight-decay rule reads the transferred LR).
      source: the reference it implements.
      exponent: its exponent, where it has one.
    """

    name: str
    fn: RuleFn
    source: str
    exponent: float | None = None


def _need(scale: Scale, field: str, rule: str, which: str) -> int:
    v = getattr(scale, field)
    if v is None:
        what = "steps and batch_size" if field == "tokens" else field
        raise ValueError(
            f"transfer rule {rule!r} needs {which}'s {what}: set it in the Scale, or switch the rule off "
            f"with rules={{{rule!r}: None}}"
        )
    return v


def _positive(x: float, key: str) -> float:
    x = float(x)
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"hparams[{key!r}] must be a finite positive number, got {x!r}")
    return x


def horizon(exponent: float = HORIZON_EXPONENT) -> Rule:
    """LR over the training horizon: ``eta' = eta * (D' / D) ** -exponent``.

    ``D`` is the number of training tokens (``Scale.tokens``). The published
    fit is at a fixed batch size, so across batch sizes this rule combines
    with :func:`batch` (equal steps at ``k`` times the batch: ``D' = k D``).

    Args:
      exponent: ``a`` in ``eta ~ D^-a``; default :data:`HORIZON_EXPONENT`
        (Bjorck et al., ICLR 2025, arXiv:2409.19913).
    """

    def fn(hp0, hp, proxy, target):
        d0, d1 = _need(proxy, "tokens", "horizon", "proxy"), _need(target, "tokens", "horizon", "target")
        lr = hp["learning_rate"] * (d1 / d0) ** -exponent
        return {"learning_rate": (lr, f"x (D'/D)^-{exponent:g} = ({d1}/{d0})^-{exponent:g}")}

    return Rule("horizon", fn, "Bjorck et al. 2025, arXiv:2409.19913", exponent)


def batch(exponent: float = BATCH_EXPONENT) -> Rule:
    """LR over the batch size at fixed tokens: ``eta' = eta * (B' / B) ** exponent``.

    Holds below the critical batch size (Filatov et al. fit ``B* ~ D^0.45``);
    beyond it the best LR stops growing and this rule overshoots.

    Args:
      exponent: ``b`` in ``eta ~ B^b``; default :data:`BATCH_EXPONENT`
        (Filatov et al., arXiv:2510.03871). ``0.5`` is the square-root rule
        for Adam (Malladi et al. 2022), ``1`` the linear rule for SGD.
    """

    def fn(hp0, hp, proxy, target):
        b0, b1 = _need(proxy, "batch_size", "batch", "proxy"), _need(target, "batch_size", "batch", "target")
        lr = hp["learning_rate"] * (b1 / b0) ** exponent
        return {"learning_rate": (lr, f"x (B'/B)^{exponent:g} = ({b1}/{b0})^{exponent:g}")}

    return Rule("batch", fn, "Filatov et al. 2025, arXiv:2510.03871", exponent)


def weight_decay_timescale() -> Rule:
    """Weight decay at a constant EMA timescale, counted as a fraction of the run.

    Decoupled weight decay ``W <- (1 - eta lambda) W - ...`` is an EMA of the
    updates with timescale ``tau = 1 / (eta lambda)`` steps; its best value is
    a constant fraction of the run (constant in epochs) as model and data grow.
    Keeping ``tau / T`` fixed gives ``lambda' = lambda * (eta T) / (eta' T')``,
    with ``eta'`` the learning rate after the rules before this one
    (Wang & Aitchison, ICML 2025, arXiv:2405.13698).
    """

    def fn(hp0, hp, proxy, target):
        if "weight_decay" not in hp or hp["weight_decay"] == 0:  # 0 stays 0: reported as unchanged
            return {}
        t0, t1 = _need(proxy, "steps", "weight_decay", "proxy"), _need(target, "steps", "weight_decay", "target")
        eta0, eta1 = hp0["learning_rate"], hp["learning_rate"]
        wd = hp["weight_decay"] * (eta0 * t0) / (eta1 * t1)
        return {"weight_decay": (wd, f"x (eta T)/(eta' T') = ({eta0:.4g} * {t0})/({eta1:.4g} * {t1})")}

    return Rule("weight_decay", fn, "Wang & Aitchison 2025, arXiv:2405.13698")


def beta2_half_life() -> Rule:
    """Adam's ``b2`` with a constant half-life in examples: ``b2' = b2 ** (B' / B)``.

    (Marek et al. 2025, arXiv:2507.07101.) Applies to the keys ``b2``, ``beta2``
    and ``adam_b2`` (the AdamW route of :func:`~spectral_optax.muon` and
    :func:`~spectral_optax.contrib_muon`).
    """

    def fn(hp0, hp, proxy, target):
        b0, b1 = _need(proxy, "batch_size", "beta2", "proxy"), _need(target, "batch_size", "beta2", "target")
        out = {}
        for k in ("b2", "beta2", "adam_b2"):
            if k in hp:
                if not 0 < hp[k] < 1:
                    raise ValueError(f"hparams[{k!r}] must be in (0, 1), got {hp[k]!r}")
                out[k] = (hp[k] ** (b1 / b0), f"^ (B'/B) = ^ ({b1}/{b0})")
        return out

    return Rule("beta2", fn, "Marek et al. 2025, arXiv:2507.07101")


def warmup_fraction() -> Rule:
    """Warm-up steps kept a fixed fraction of the run: ``w' = round(w * T' / T)``
    (a ``warmup`` given as a fraction is kept)."""

    def fn(hp0, hp, proxy, target):
        if "warmup_steps" not in hp:
            return {}
        t0, t1 = _need(proxy, "steps", "warmup", "proxy"), _need(target, "steps", "warmup", "target")
        w = float(max(1, round(hp["warmup_steps"] * t1 / t0)))
        return {"warmup_steps": (w, f"x T'/T = x {t1}/{t0}")}

    return Rule("warmup", fn, "fixed fraction of the run")


#: The rules :func:`~spectral_optax.transfer.transfer` applies, in order (the weight-decay rule reads the
#: transferred LR).
DEFAULT_RULES: tuple[Rule, ...] = (horizon(), batch(), weight_decay_timescale(), beta2_half_life(), warmup_fraction())


# --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Transfer:
    """The target's hyperparameters and the account of every factor applied.

    Index it like the dict of hyperparameters (``t['learning_rate']``);
    ``str(t)`` prints the account.
    """

    hparams: dict[str, float]
    proxy_hparams: dict[str, float]
    proxy: Scale
    target: Scale
    factors: tuple[Factor, ...]
    rules: tuple[str, ...]

    def __getitem__(self, key: str) -> float:
        return self.hparams[key]

    def lr_factor(self) -> float:
        """Total factor on the learning rate (target / proxy)."""
        return self.hparams["learning_rate"] / self.proxy_hparams["learning_rate"]

    def warmup_cosine(self, end_value: float = 0.0):
        """An ``optax.warmup_cosine_decay_schedule`` from 0 to the transferred peak LR
        over ``warmup_steps`` (default: 5% of the target's steps), decaying to
        ``end_value`` at ``target.steps``."""
        import optax

        steps = _need(self.target, "steps", "warmup_cosine", "target")
        warm = int(self.hparams.get("warmup_steps", max(1, round(0.05 * steps))))
        return optax.warmup_cosine_decay_schedule(0.0, self.hparams["learning_rate"], warm, steps, end_value)

    def __str__(self) -> str:
        p, t = self.proxy, self.target
        lines = [
            f"transfer: steps {p.steps} -> {t.steps}, batch {p.batch_size} -> {t.batch_size}, "
            f"tokens {p.tokens} -> {t.tokens}",
            f"  width {p.width} -> {t.width}, depth {p.depth} -> {t.depth}: not applied here "
            "(the parametrization and depth_residual_scale transfer them)",
        ]
        for f in self.factors:
            lines.append(f"  {f.rule:12s} {f.key:14s} {f.before:.6g} -> {f.after:.6g}  ({f.formula}; {f.source})")
        for k, v in self.hparams.items():
            if all(f.key != k for f in self.factors):
                lines.append(f"  {'-':12s} {k:14s} {v:.6g} unchanged")
        return "\n".join(lines)


def _resolve_rules(rules) -> list[Rule]:
    if rules is None:
        return list(DEFAULT_RULES)
    if isinstance(rules, Mapping):
        by_name = {r.name: r for r in DEFAULT_RULES}
        unknown = [k for k in rules if k not in by_name and rules[k] is not None and not isinstance(rules[k], Rule)]
        if unknown:
            raise ValueError(f"rules: {unknown} are neither Rule objects nor None")
        out = [rules.get(r.name, r) for r in DEFAULT_RULES] + [v for k, v in rules.items() if k not in by_name]
        return [r for r in out if r is not None]
    out = list(rules)
    bad = [r for r in out if not isinstance(r, Rule)]
    if bad:
        raise TypeError(f"rules must be Rule objects (e.g. spectral_optax.transfer.horizon()), got {bad!r}")
    return out


def transfer(
    hparams: Mapping[str, float],
    proxy: Scale,
    target: Scale,
    rules: Mapping[str, Rule | None] | Sequence[Rule] | None = None,
) -> Transfer:
    """Map a proxy's tuned hyperparameters to a target run.

    Args:
      hparams: the proxy's tuned values: ``learning_rate`` (the peak LR;
        required), and any of ``weight_decay``, ``b2`` / ``beta2``, ``b1`` /
        ``momentum`` (kept), ``warmup_steps``, ``warmup`` (a fraction, kept).
      proxy: the scale the hyperparameters were tuned at.
      target: the scale to train at.
      rules: ``None``: :data:`DEFAULT_RULES`; a mapping ``name -> Rule or
        None`` overrides or switches off default rules by name (``{'batch':
        batch(0.5), 'horizon': None}``), other names append rules; a
        sequence replaces the list. Rules run in order.

    Returns:
      a :class:`Transfer` (the new values, and every factor applied).
    """
    if not isinstance(proxy, Scale) or not isinstance(target, Scale):
        raise TypeError("proxy and target must be spectral_optax.transfer.Scale objects")
    if "learning_rate" not in hparams:
        raise ValueError("hparams needs 'learning_rate' (the proxy's tuned peak LR)")
    if callable(hparams["learning_rate"]):
        raise TypeError(
            "hparams['learning_rate'] must be the peak LR (a number); build the schedule from the result, "
            "e.g. Transfer.warmup_cosine() or optax.cosine_decay_schedule(t['learning_rate'], target.steps)"
        )
    unknown = [k for k in hparams if k not in KNOWN_KEYS]
    if unknown:
        raise ValueError(f"hparams: unknown keys {unknown}; known: {list(KNOWN_KEYS)}")
    hp0 = {k: float(v) for k, v in hparams.items()}
    for k in ("learning_rate", "weight_decay", "warmup_steps"):
        if k in hp0 and (k != "weight_decay" or hp0[k] != 0):
            _positive(hp0[k], k)
    hp = dict(hp0)
    factors, used = [], []
    for rule in _resolve_rules(rules):
        changes = rule.fn(hp0, hp, proxy, target)
        used.append(rule.name)
        for key, (value, formula) in changes.items():
            if not math.isfinite(value):
                raise ValueError(f"rule {rule.name!r} gave a non-finite {key!r} ({value!r})")
            factors.append(Factor(rule.name, key, hp[key], float(value), formula, rule.source))
            hp[key] = float(value)
    return Transfer(hp, hp0, proxy, target, tuple(factors), tuple(used))
