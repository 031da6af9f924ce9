"""The whole-tree plan of the distributed orthogonalization (docs/sharding.md, "The plan").

Every orthogonalized matrix is read in its wide form ``m x n`` (``m <= n``)
and same-shape matrices across the tree form one group of ``B`` matrices.
On ``N`` devices each group gets a split factor ``k`` (a divisor of ``N``):
the devices are viewed as ``N / k`` owner groups of ``k`` devices each, the
``B`` matrices are dealt to the owner groups (``ceil(B k / N)`` per group) and
each matrix is cut along its long side into ``k`` column blocks, one per
device of its owner group. With ``k = 1`` every device owns whole matrices
and runs the iteration alone; with ``k > 1`` the short-side Gram matrix
``X X^T`` (``m x m``) of every step is summed over the ``k`` devices (one
all-reduce per step), each device updating its own columns.

Cost per device of one quintic step on a block ``m x c`` (the standard
iteration, :func:`spectral_optax.newton_schulz`): ``4 m^2 c + 2 m^3`` flops
(Gram, its square, the update), so a split divides only the first term. The
plan picks, per group, the ``k`` minimizing::

    flops(k) + f * gram_bytes(k),
    flops(k)      = ceil(B k / N) * (whole-matrix flops          if k = 1,
                                     steps 6 m^2 c                   if k > 1 and c < m,
                                     steps (4 m^2 c + 2 m^3)         otherwise),
    gram_bytes(k) = ceil(B k / N) * steps * m (m + 1) / 2 * itemsize(compute dtype)   (k > 1),

with ``c = ceil(n / k)`` for ``k = N`` and ``c = ceil(n / N) N / k`` for ``1 < k < N`` (the
columns zero-padded to a multiple of ``N``, so that one all-to-all over the owner groups deals
the blocks), the all-reduce sending the upper triangle of each symmetric Gram matrix only
(:func:`spectral_optax.expert.psum_symmetric`), and ``f`` the flops one byte through a
collective is worth on the platform (``flops_per_byte``; :func:`default_flops_per_byte`).

A split group runs under ``shard_map`` (over every device for ``k = N``, else on
the devices viewed as an ``(N / k, k)`` mesh, the Gram sums over each owner
group) and a block narrower than its Gram matrix (``c < m``) is updated as
``b (A X) + c A (A X)`` (``2 m^2 c`` for the Gram and ``4 m^2 c`` for the
update, instead of ``2 m^3 + 2 m^2 c``): no device repeats the ``A^2`` product.

A group of fewer matrices than devices (``B < N``: whole matrices leave devices idle) whose whole
matrices run the Gram-space iteration (``method='gram'``) and that is in no pack may run it on its
split blocks too, where that scores lower (``split_gram_costs``; packs are decided first,
:func:`with_gram_splits`; a group that fills every device keeps its whole matrices or the standard
split, whose bytes are fewer): ``X X^T`` summed once per
segment, the ``m x m`` polynomial work split over the ``k`` devices by columns and all-gathered
(two all-gathers per step), so a device's flops are the whole matrix's over ``k`` plus the
``4 m^2 c`` of its block per segment (Qwen2.5-0.5B's ``896 x 4864`` in float32: 40.1 GFLOP whole,
20.0 per device in 2 blocks, where the standard iteration on 2 blocks costs 46.2).
A ``'power'`` start (``power_start``) forms its ``A_0^2`` whole on every device of a standard split
(:func:`split_block_flops`), by columns on a Gram-space one.

Every device runs every group's program (one SPMD program), so the flops of
a device are the sum over groups of ``flops(k)``.

**Packing** (``pack_groups``). A split group ``A`` (``m x n``, ``k`` column
blocks of width ``c = n / k``) and a group ``B`` of whole ``m x c`` matrices
have local blocks of one shape, so ``B``'s matrices can ride in ``A``'s stack,
``k`` of them side by side in one ``m x k c`` unit whose owner group must not
sum their Gram matrices: each owner group runs its blocks with the Gram sum
(a unit of ``A``) or without it (a unit of ``B``), decided per owner group at
run time (``lax.cond`` on the owner-group index). The units,
``B_A + ceil(B_B / k)``, are dealt to the ``N / k`` owner groups, ``b`` per
group, and a device's flops are ``b * max(split block, whole m x c)``
(Llama-style 1.2B on 256 devices: 48 MLP matrices of ``2048 x 8192`` in 4
blocks and 64 squares, 4 per unit: 64 units, one ``2048 x 2048`` block per
device). The pack replaces the two groups' plans when it costs less, at any split ``k`` of the
split group: at a CPU's ``flops_per_byte`` the ``2048 x 8192`` group alone is best split in 16
blocks, which no whole group fits, yet its pack in 4 blocks costs less than the two plans alone
(the same flops, 40 instead of 160 MiB of Gram all-reduces per device).

**Sharing the devices** (:func:`co_place`). Groups in no pack may be dealt one whole matrix, or
one column block of a matrix cut in ``k`` blocks, per device, group after group, each device
running its own matrix's iteration only: the flops and Gram bytes per device are then the
costliest branch's, not the sum over the groups.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from spectral_optax._duals.polar.policy import newton_schulz_flops

__all__ = [
    "FLOPS_PER_BYTE_BY_KIND",
    "GroupPlan",
    "OrthogonalizationPlan",
    "co_place",
    "default_flops_per_byte",
    "pack_groups",
    "plan_group",
    "with_gram_splits",
]

#: Flops one byte through a collective is worth, per device kind: the chip's peak dense rate in
#: the iteration's accelerator dtype (bfloat16; float32 on a CPU) over its interconnect bandwidth
#: per direction (what a Gram all-reduce's bytes cross), both from the vendor's spec sheet.
#: Keys are matched, in order, as substrings of ``device_kind.lower()``; the ``platform`` keys
#: (``'gpu'``, ``'tpu'``, ``'cpu'``) are the fallbacks for a kind not listed.
#:
#: * NVIDIA H100 / H200 SXM: 989 TFLOP/s bfloat16 dense over NVLink 4's 450 GB/s per direction
#:   (900 GB/s total), 2198 (NVIDIA H100 and H200 datasheets); also the ``'gpu'`` fallback;
#: * NVIDIA A100 SXM: 312 TFLOP/s bfloat16 dense over NVLink 3's 300 GB/s per direction
#:   (600 GB/s total), 1040 (NVIDIA A100 datasheet);
#: * TPU v5e (``device_kind`` ``'TPU v5 lite'``): 197 TFLOP/s bfloat16 over 1600 Gbit/s = 200 GB/s
#:   of ICI per direction (400 GB/s bidirectional), 985 (Cloud TPU v5e system architecture page);
#: * TPU v5p (``'TPU v5'``): 459 TFLOP/s bfloat16 over 4800 Gbit/s = 600 GB/s of ICI, 765 (Cloud
#:   TPU v5p system architecture page; per direction, as v5e's 1600 Gbit/s); also the ``'tpu'`` fallback;
#: * CPU: a 96-core AMD EPYC 9654 socket, 7.4 TFLOP/s float32 (96 cores x 2.4 GHz x 32 float32
#:   flops per cycle, AVX-512 on two 256-bit FMA pipes) over a 200 Gbit/s = 25 GB/s host NIC (the
#:   collectives of a multi-host CPU job), 296. Host devices of one process
#:   (``--xla_force_host_platform_device_count``) copy through memory instead; the figure is the
#:   multi-host one.
FLOPS_PER_BYTE_BY_KIND: dict[str, float] = {
    "h100": 989e12 / 450e9,
    "h200": 989e12 / 450e9,
    "a100": 312e12 / 300e9,
    "v5 lite": 197e12 / 200e9,
    "v5e": 197e12 / 200e9,
    "v5p": 459e12 / 600e9,
    "v5": 459e12 / 600e9,
    "gpu": 989e12 / 450e9,
    "tpu": 459e12 / 600e9,
    "cpu": 7.4e12 / 25e9,
}


def default_flops_per_byte(device: Any = None) -> float:
    """The :data:`FLOPS_PER_BYTE_BY_KIND` figure of ``device`` (default ``jax.devices()[0]``): its
    ``device_kind``'s row when one matches, else its ``platform``'s (the GPU figure for an
    unknown platform).

    Args:
      device: a ``jax.Device`` (anything with ``platform`` and ``device_kind``), or ``None``.
    """
    device = jax.devices()[0] if device is None else device
    kind = str(getattr(device, "device_kind", "")).lower()
    for key, value in FLOPS_PER_BYTE_BY_KIND.items():
        if key not in ("gpu", "tpu", "cpu") and key in kind:
            return value
    platform = str(getattr(device, "platform", "gpu")).lower()
    return FLOPS_PER_BYTE_BY_KIND.get(platform, FLOPS_PER_BYTE_BY_KIND["gpu"])


@dataclasses.dataclass(frozen=True)
class GroupPlan:
    """How one group of same-shape (wide, ``m <= n``) matrices is spread over the devices.

    Attributes:
      m: short side.
      n: long side.
      count: number of matrices ``B`` in the group.
      split: ``k``, the devices sharing one matrix (its columns cut in ``k`` blocks).
      owners: ``N / k`` owner groups the matrices are dealt to.
      method: ``'standard'`` or ``'gram'`` (the iteration run; on split matrices ``'gram'`` is
        ``split_gram_costs``'s route).
      flops: predicted matmul flops per device.
      whole_flops: flops of the whole group on one device.
      gram_bytes: bytes per device through the Gram all-reduces (``0`` when ``k = 1``).
      move_bytes: bytes per device moving the group's matrices to their owners and back
        (an upper bound: the device's share of the group, twice, in the moved dtype).
      paths: the parameter paths whose slices are in the group.
      packed_with: ``(m, n)`` of the group this one shares a stack with (``pack_groups``):
        on the split group the flops and bytes are the pack's, on the packed group zero.
      packed_count: on the split group of a pack, the number of matrices packed into its units.
      shared: the groups (``(m, n)`` keys, this one among them) whose whole matrices share the
        devices, one matrix per device, in slot order (the plan's ``co_place``); on the first the flops
        are the set's, on the others zero. Empty when the group has the devices to itself.
    """

    m: int
    n: int
    count: int
    split: int
    owners: int
    method: str
    flops: float
    whole_flops: float
    gram_bytes: float
    move_bytes: float
    paths: tuple[str, ...]
    packed_with: tuple[int, int] | None = None
    packed_count: int = 0
    shared: tuple[tuple[int, int], ...] = ()

    @property
    def per_device(self) -> int:
        """Matrices (or column blocks of them, when ``split > 1``) held by one device."""
        if self.packed_with is not None and self.split == 1:
            return 0  # in the split group's units
        return -(-self.units // self.owners)

    @property
    def units(self) -> int:
        """The number of stacked units dealt to the owner groups; for a pack, the split group's matrices
        plus ``ceil(count / split)`` units of ``split`` packed matrices each."""
        return self.count + (-(-self.packed_count // self.split) if self.packed_with else 0)


@dataclasses.dataclass(frozen=True)
class OrthogonalizationPlan:
    """The whole-tree plan: one :class:`~spectral_optax.expert.GroupPlan` per shape group; ``print(plan)`` shows it.

    Attributes:
      devices: number ``N`` of devices the work is spread over.
      groups: one :class:`~spectral_optax.expert.GroupPlan` per group of same-shape matrices.
    """

    devices: int
    groups: tuple[GroupPlan, ...]

    @property
    def flops_per_device(self) -> float:
        """Predicted flops of the busiest device (every device runs every group)."""
        return float(sum(g.flops for g in self.groups))

    @property
    def total_flops(self) -> float:
        """Flops of the whole orthogonalization on one device."""
        return float(sum(g.whole_flops for g in self.groups))

    @property
    def bytes_per_device(self) -> float:
        """Predicted bytes per device through collectives (moves and Gram all-reduces)."""
        return float(sum(g.gram_bytes + g.move_bytes for g in self.groups))

    def __str__(self) -> str:
        n = self.devices
        lines = [
            f"orthogonalization plan on {n} device(s): {len(self.groups)} group(s), "
            f"{sum(g.count for g in self.groups)} matrices",
            f"{'m x n':>15} {'count':>6} {'split':>5} {'owners':>6} {'per dev':>7} {'method':>8} "
            f"{'GFLOP/dev':>10} {'MiB gram':>9} {'MiB move':>9}  paths",
        ]
        for g in self.groups:
            paths = ", ".join(g.paths[:2]) + (f", ... ({len(g.paths)})" if len(g.paths) > 2 else "")
            if g.packed_with is not None:
                paths = f"[packed with {g.packed_with[0]} x {g.packed_with[1]}] " + paths
            others = [f"{a} x {b}" for a, b in g.shared if (a, b) != (g.m, g.n)]
            if others:
                paths = f"[devices shared with {', '.join(others)}] " + paths
            lines.append(
                f"{f'{g.m} x {g.n}':>15} {g.count:>6} {g.split:>5} {g.owners:>6} {g.per_device:>7} "
                f"{g.method:>8} {g.flops / 1e9:>10.2f} {g.gram_bytes / 2**20:>9.1f} "
                f"{g.move_bytes / 2**20:>9.1f}  {paths}"
            )
        ideal = self.total_flops / n
        ratio = self.flops_per_device / ideal if ideal else 1.0
        lines.append(
            f"per device: {self.flops_per_device / 1e9:.2f} GFLOP ({ratio:.3f}x the one-device "
            f"{self.total_flops / 1e9:.2f} GFLOP / {n}), {self.bytes_per_device / 2**20:.1f} MiB through collectives"
        )
        return "\n".join(lines)


def plan_group(
    m: int,
    n: int,
    count: int,
    devices: int,
    *,
    steps: int | None,
    method: str,
    compute_itemsize: int,
    move_itemsize: int,
    paths: tuple[str, ...] = (),
    restarts: tuple[int, ...] = (),
    flops_per_byte: float | None = None,
    power_start: bool = False,
    gram_splits: bool = True,
) -> GroupPlan:
    """The cheapest split ``k`` of one group (module docstring); ``steps=None``
    (a user orthogonalization function) allows whole matrices only.

    Args:
      m: short side of the group's matrices.
      n: long side.
      count: number of matrices.
      devices: number ``N`` of devices.
      steps: Newton-Schulz steps, or ``None`` for a user function (cost unknown).
      method: the whole-matrix iteration (``'standard'`` or ``'gram'``).
      compute_itemsize: bytes per element of the iteration's dtype (the Gram all-reduces).
      move_itemsize: bytes per element of the moved matrices.
      paths: parameter paths, for printing.
      restarts: the Gram-space restarts of the whole-matrix iteration (``method='gram'``).
      flops_per_byte: flops one byte through the Gram all-reduce is worth (``None``:
        :func:`default_flops_per_byte`).
      power_start: whether the iteration starts from the ``'power'`` preconditioning (its
        ``A_0^2``, ``2 m^3``, is formed whole on every device of a split: :func:`split_block_flops`).
      gram_splits: whether a ``method='gram'`` group of fewer matrices than devices may run the
        Gram-space iteration on split blocks (``split_gram_costs``); ``False``: split blocks run
        the standard iteration.
    """
    fpb = default_flops_per_byte() if flops_per_byte is None else float(flops_per_byte)
    whole = newton_schulz_flops(m, n, steps, method, restarts=restarts) if steps else 0
    best: tuple[float, int, GroupPlan] | None = None
    for k in range(1, min(devices, n) + 1):
        if devices % k or (k > 1 and not steps):
            continue
        if k == 1:
            flops, gram, meth = float(-(-count // devices) * whole), 0.0, method
        else:
            assert steps is not None
            flops, gram = split_costs(m, n, count, devices, k, steps, compute_itemsize, power_start)
            meth = "standard"
            if method == "gram" and gram_splits and count < devices:  # Gram space on the blocks, if cheaper
                g_flops, g_bytes = split_gram_costs(
                    m, n, count, devices, k, steps, restarts, compute_itemsize, power_start
                )
                if g_flops + fpb * g_bytes < flops + fpb * gram:
                    flops, gram, meth = g_flops, g_bytes, "gram"
        move = float(2 * math.ceil(count * m * n / devices) * move_itemsize)
        plan = GroupPlan(m, n, count, k, devices // k, meth, flops, float(count * whole), gram, move, paths)
        score = flops + fpb * gram
        if best is None or (score, k) < best[:2]:
            best = (score, k, plan)
    assert best is not None
    return best[2]


def split_costs(
    m: int, n: int, count: int, devices: int, k: int, steps: int, compute_itemsize: int, power_start: bool = False
) -> tuple[float, float]:
    """``(flops, gram bytes)`` per device of a group of ``count`` wide ``m x n`` matrices split in
    ``k > 1`` column blocks (the columns padded as :func:`columns_multiple` says), the standard
    iteration on the blocks."""
    per = -(-count // (devices // k))
    cols = _block_columns(n, k, devices)
    return (
        float(per * split_block_flops(m, cols, steps, power_start)),
        float(per * steps * triangle(m) * compute_itemsize),
    )


def split_gram_costs(
    m: int,
    n: int,
    count: int,
    devices: int,
    k: int,
    steps: int,
    restarts: tuple[int, ...],
    compute_itemsize: int,
    power_start: bool = False,
) -> tuple[float, float]:
    """``(flops, collective bytes)`` per device of the group of :func:`split_costs` running the
    Gram-space iteration on its blocks, its ``m x m`` work split over the ``k`` devices too
    (:func:`~spectral_optax.newton_schulz` with ``method='gram'`` and ``axis_name``). With ``c``
    the block's columns, ``m' = k ceil(m / k)`` and ``j`` segments of ``K = steps`` steps, a block
    costs ``j 4 m^2 c + 2 m'^3 (4 K - 3 j) / k`` flops (the whole matrix's Gram-space flops,
    :func:`~spectral_optax.expert.newton_schulz_flops`, its ``m^3`` part divided by ``k``; a
    ``'power'`` start's ``A_0^2`` is formed by columns too); bytes: ``j`` Gram all-reduces (upper
    triangles) and :func:`split_gram_gathers` all-gathers (one more for a ``'power'`` start's
    ``A_0^2``), each receiving ``m'^2 (k - 1) / k`` elements."""
    per = -(-count // (devices // k))
    cols = _block_columns(n, k, devices)
    rs = tuple(i for i in restarts if 0 < i < steps)
    j = 1 + len(rs)
    mp = -(-m // k) * k
    flops = j * 4 * m * m * cols + 2 * mp**3 * max(4 * steps - 3 * j, 1) // k
    gathers = 0
    if power_start:
        gathers += 1  # A_0^2
        if 1 in rs or steps == 1:  # the first step in X-space: the Gram-space steps after it
            steps, rs = steps - 1, tuple(i - 1 for i in rs if i > 1)
    gathers += split_gram_gathers(steps, rs) if steps else 0
    nbytes = (j * triangle(m) + gathers * mp * mp * (k - 1) // k) * compute_itemsize
    return float(per * flops), float(per * nbytes)


def split_gram_gathers(steps: int, restarts: tuple[int, ...] = ()) -> int:
    """All-gathers of one ``m' x m'`` matrix (by column blocks) in the split Gram-space iteration
    of ``steps`` steps, restarting at ``restarts``: ``P`` where ``Q`` or ``R`` is updated by it,
    ``R`` after every step but a segment's last, ``Q`` at the end of each segment."""
    count, fresh = 0, True
    for i in range(steps):
        if i in restarts and not fresh:
            count, fresh = count + 1, True
        more = i < steps - 1 and i + 1 not in restarts
        count += int(not fresh or more) + int(more)
        fresh = False
    return count + 1


def _block_columns(n: int, k: int, devices: int) -> int:
    """The block width of ``n`` columns split in ``k`` (padded as :func:`columns_multiple` says)."""
    step = columns_multiple(k, devices)
    return -(-n // step) * step // k


def columns_multiple(split: int, devices: int) -> int:
    """What a group's stack of columns is zero-padded to a multiple of: ``N`` when it is split
    over owner subgroups (``1 < k < N``: the all-to-all deal over the owner groups cuts the
    columns over every device), else ``k``."""
    return devices if 1 < split < devices else split


def triangle(m: int) -> int:
    """Elements of the upper triangle of an ``m x m`` matrix, diagonal included: what one
    Gram all-reduce sends per matrix (:func:`spectral_optax.expert.psum_symmetric`)."""
    return m * (m + 1) // 2


def split_block_flops(m: int, cols: int, steps: int, power_start: bool = False) -> int:
    """Flops on one device of a matrix with ``m`` rows split in column blocks of width ``cols``
    (under ``shard_map``): ``steps 6 m^2 cols`` when the block is narrower than its Gram matrix
    (``b (A X) + c A (A X)``), else ``steps (4 m^2 cols + 2 m^3)``. A ``'power'`` start forms
    ``A_0^2`` whole (``2 m^3``, for its scale) and runs the first step as ``(b A_0 + c A_0^2) X_0``
    (``2 m^2 cols``): on a narrow block ``2 m^3 - 2 m^2 cols`` more."""
    extra = 2 * m**3 - 2 * m * m * cols if power_start and cols < m else 0
    return steps * (6 * m * m * cols if cols < m else 4 * m * m * cols + 2 * m**3) + extra


def pack_groups(
    plans: dict,
    devices: int,
    *,
    steps: int | None,
    compute_itemsize: int,
    whole_methods: dict | None = None,
    flops_per_byte: float | None = None,
    power_start: bool = False,
) -> dict:
    """``plans`` (``{(m, n): GroupPlan}``) with a split group and a group of whole matrices of
    its block shape sharing one stack where that costs less than the two groups' own plans
    (module docstring, "Packing"); every split ``k`` of the split group is tried, not only the one
    of its own plan (a split that loses alone can win packed); each group in at most one pack,
    the largest gain first.

    Args:
      plans: the groups' own plans (:func:`plan_group`).
      devices: number ``N`` of devices.
      steps: Newton-Schulz steps (``None``: no packing).
      compute_itemsize: bytes per element of the iteration's dtype (the Gram all-reduces).
      whole_methods: ``{(m, n): method}``, the whole-matrix iteration of each group (default:
        each plan's ``method``), run by a packed group.
      flops_per_byte: as in :func:`plan_group`.
      power_start: as in :func:`plan_group`.
    """
    if not steps:
        return plans
    fpb = default_flops_per_byte() if flops_per_byte is None else float(flops_per_byte)
    plans = dict(plans)
    best = []
    for a in plans.values():  # every split k of a, not only its own plan's: a pack can beat both plans
        alone_a = a.flops + fpb * a.gram_bytes
        for k in range(2, min(devices, a.n)):
            if devices % k or a.n % k:
                continue
            cols = a.n // k
            b = plans.get((a.m, cols)) if cols >= a.m else None
            if b is None or b is a:
                continue
            units = a.count + -(-b.count // k)
            per = -(-units // (devices // k))
            whole = b.whole_flops / b.count
            flops = float(per * max(split_block_flops(a.m, cols, steps, power_start), whole))
            gram = float(per * steps * triangle(a.m) * compute_itemsize)
            gain = alone_a + b.flops + fpb * b.gram_bytes - flops - fpb * gram
            if gain > 0:
                best.append((-gain, k, (a.m, a.n), (b.m, b.n), flops, gram))
    used: set = set()
    for _, k, ka, kb, flops, gram in sorted(best):
        if ka in used or kb in used:
            continue
        used.update((ka, kb))
        a, b = plans[ka], plans[kb]
        plans[ka] = dataclasses.replace(
            a, split=k, owners=devices // k, method="standard", flops=flops, gram_bytes=gram,
            packed_with=kb, packed_count=b.count,
        )  # fmt: skip
        plans[kb] = dataclasses.replace(
            b,
            split=1,
            owners=devices,
            method=(whole_methods or {}).get(kb, b.method),
            flops=0.0,
            gram_bytes=0.0,
            packed_with=ka,
        )
    return plans


def with_gram_splits(plans: dict, gram_plans: dict) -> dict:
    """``plans`` (after :func:`pack_groups`, planned with ``gram_splits=False``) with every group in
    no pack replaced by its plan in ``gram_plans`` (the same group planned with ``gram_splits=True``,
    never costlier): packs are decided first, on the standard iteration's splits (a pack adds no
    bytes; a Gram-space split adds two all-gathers per step), and only the groups left alone may
    take the Gram-space split (module docstring)."""
    return {key: p if p.packed_with is not None else gram_plans.get(key, p) for key, p in plans.items()}


def co_place(
    plans: dict,
    devices: int,
    *,
    whole_methods: dict | None = None,
    flops_per_byte: float | None = None,
    steps: dict | None = None,
    compute_itemsize: int = 4,
    power_start: dict | None = None,
    blocks: tuple[int, ...] = (),
) -> dict:
    """``plans`` with groups sharing the devices where that costs less: groups in no pack, each
    group ``i`` as whole matrices (``k_i = 1``) or cut in ``k_i`` column blocks, ``sum_i B_i k_i
    <= N`` devices in all, dealt one matrix or block per device (group ``i`` on the slots after
    group ``i - 1``'s, a matrix's blocks on ``k_i`` consecutive devices), each device running its
    own matrix's iteration only (a branch on its index; a split matrix's Gram matrices summed over
    its ``k_i`` devices inside the branch). Every device of one SPMD program otherwise runs every
    group's program, so groups cost the sum of their scores per device; sharing, the costliest
    branch's. Each candidate branch score ``T`` is tried: every group takes the fewest devices
    whose branch scores at most ``T`` (``flops + f gram_bytes``, :func:`plan_group`; a block runs
    the standard iteration, :func:`split_block_flops`, and all-reduces ``steps`` upper triangles; a
    group is split only where the devices divide its rows, so that any layout of it is dealt from its
    rows, columns or tiles by the one all-to-all),
    the groups of most score per device first while the devices last, the others keeping their
    own plans; the set of least total score is kept where it is below the groups' own plans (Llama
    6.7B on 256 devices at ``f = 2000``: 128 squares of 4096 and 96 ``4096 x 11008`` matrices,
    split in 2 column blocks each, 2631 GFLOP and 512 MiB of Gram traffic per device; shared whole,
    3075 GFLOP and none; on 512 devices the MLP matrices in 2 blocks, the squares whole and the
    head in 8 blocks: one block's Gram traffic per device instead of three).

    Args:
      plans: ``{(m, n): GroupPlan}`` (after :func:`pack_groups` and :func:`with_gram_splits`).
      devices: number ``N`` of devices.
      whole_methods: ``{(m, n): method}``, the whole-matrix iteration of each group (default:
        each plan's ``method``).
      flops_per_byte: as in :func:`plan_group`.
      steps: ``{(m, n): steps}``, each group's Newton-Schulz steps (a group missing or ``None``, a
        user function: whole matrices only).
      compute_itemsize: bytes per element of the iteration's dtype (the Gram all-reduces).
      power_start: ``{(m, n): bool}``, as in :func:`plan_group`.
      blocks: the sizes of the device axes' trailing products (the mesh axes the devices are laid
        out on, minor first); a split ``k`` is offered when it divides ``N`` and, for every size
        ``s`` here and every other ``k`` chosen, ``k`` divides it or is a multiple of it (so that
        ``k`` consecutive devices are a product of trailing axes of one view of the devices).
    """
    fpb = default_flops_per_byte() if flops_per_byte is None else float(flops_per_byte)
    free = [p for p in plans.values() if p.packed_with is None and p.whole_flops > 0]
    score = lambda p: p.flops + fpb * p.gram_bytes
    nested = lambda a, b: a % b == 0 or b % a == 0
    sizes = [k for k in range(2, devices + 1) if devices % k == 0 and all(nested(k, s) for s in blocks)]
    options = {}  # (m, n): [(devices used, branch score, k, flops, gram bytes)], fewest devices first
    for p in free:
        opts = [(p.count, p.whole_flops / p.count, 1, p.whole_flops / p.count, 0.0)] if p.count <= devices else []
        n_steps, power = (steps or {}).get((p.m, p.n)), (power_start or {}).get((p.m, p.n), False)
        for k in sizes if n_steps else ():
            assert n_steps is not None
            if p.count * k <= devices and k <= p.n and p.m % devices == 0:  # rows over the devices: dealt
                f = split_block_flops(p.m, -(-p.n // k), n_steps, power)
                g = n_steps * triangle(p.m) * compute_itemsize
                opts.append((p.count * k, f + fpb * g, k, float(f), float(g)))
        options[(p.m, p.n)] = opts
    own = sum(score(p) for p in free)
    best: tuple[float, list] | None = None
    for t in sorted({o[1] for opts in options.values() for o in opts}):
        fits = [
            (p, min(o for o in options[(p.m, p.n)] if o[1] <= t))
            for p in free
            if any(o[1] <= t for o in options[(p.m, p.n)])
        ]
        members, used, ks = [], 0, set(blocks)
        for p, o in sorted(fits, key=lambda po: -score(po[0]) / po[1][0]):
            if used + o[0] <= devices and all(nested(o[2], k) for k in ks if o[2] > 1):
                members.append((p, o))
                used += o[0]
                ks |= {o[2]} if o[2] > 1 else set()
        if len(members) < 2:
            continue
        total = max(o[1] for _, o in members) + own - sum(score(p) for p, _ in members)
        if total < own and (best is None or total < best[0]):
            best = (total, sorted(members, key=lambda po: (-po[1][2], -po[1][3])))  # larger splits first (aligned)
    if best is None:
        return plans
    plans = dict(plans)
    members = best[1]
    keys = tuple((p.m, p.n) for p, _ in members)
    flops, gram = max(o[3] for _, o in members), max(o[4] for _, o in members)
    for i, (p, (_, _, k, _, _)) in enumerate(members):
        method = (whole_methods or {}).get((p.m, p.n), p.method) if k == 1 else "standard"
        plans[(p.m, p.n)] = dataclasses.replace(
            p, split=k, owners=devices // k, method=method,
            flops=flops if i == 0 else 0.0, gram_bytes=gram if i == 0 else 0.0, shared=keys,
        )  # fmt: skip
    return plans
