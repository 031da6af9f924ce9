"""The real-model tier (issue 52): every Flax class that Hugging Face ``transformers`` 4.46.x ships,
built at a tiny config with random weights (nothing downloaded, no PyTorch), checked with no
hand-written truth.

Used by ``tests/test_real_models.py`` (slow tier, the ``models`` extra); run as a script it prints
the tier's counts (classes, leaves, problems):

    python tests/_hf_tier.py [CLASS ...]

Checks, per class:

* the geometry on the model route (``GeometryMap.from_apply`` on the model's own ``__call__``) leaves
  no leaf undecided (the element-wise fallback) and gives no ``GeometryWarning``;
* the read-outs are exactly the leaves the logits read directly: a leaf is a read-out iff it has an
  axis of the logits' size along which changing index ``j`` changes the logits at ``j`` only (a head's
  column, its bias, a tied table's row for a token not in the input), found by perturbing the values;
* one step of ``muon``, ``moga`` and ``mup_adamw`` runs, keeps every leaf's dtype and moves every leaf.

The coordinate check across widths is in ``coord_check`` below.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import spectral_optax as so

VOCAB = 99  # the logits' size for language models; no other axis has it
LABELS = 3  # num_labels for classification heads
SEQ = 8
BATCH = 2


def flax_classes() -> list[tuple[str, str]]:
    """``[(model_type, class_name)]`` for every Flax class that the installed transformers maps."""
    import transformers.models.auto.modeling_flax_auto as A

    pairs: dict[str, str] = {}
    for name in dir(A):
        if name.startswith("FLAX_MODEL") and name.endswith("MAPPING_NAMES"):
            for model_type, cls in getattr(A, name).items():
                pairs.setdefault(cls, model_type)
    return sorted((t, c) for c, t in pairs.items())


# The composite classes wrap two configs of other types: not built here (their parts are).
COMPOSITE = {
    "encoder-decoder": "wraps two models' configs (its parts, BERT / GPT-2 ..., are in the tier)",
    "speech-encoder-decoder": "wraps two models' configs (its parts, Wav2Vec2 / BART ..., are in the tier)",
    "vision-encoder-decoder": "wraps two models' configs (its parts, ViT / GPT-2 ..., are in the tier)",
    "vision-text-dual-encoder": "wraps two models' configs (its parts, ViT / BERT ..., are in the tier)",
}


# Classes that cannot run on today's JAX (0.10): the cause, for the tier's documented xfails.
_NO_SPLIT = "transformers 4.46 calls the jax.Array.split method, which JAX 0.10 removed (jnp.split remains)"
XFAIL = {
    "FlaxAlbertForQuestionAnswering": _NO_SPLIT,
    "FlaxBigBirdForQuestionAnswering": _NO_SPLIT,
    "FlaxElectraForQuestionAnswering": _NO_SPLIT,
    "FlaxDistilBertForQuestionAnswering": _NO_SPLIT,
    **{f"FlaxRoFormer{h}": _NO_SPLIT + " (its sinusoidal positions)" for h in (
        "ForMaskedLM", "ForMultipleChoice", "ForQuestionAnswering", "ForSequenceClassification",
        "ForTokenClassification", "Model")},
}  # fmt: skip


def tiny_config(model_type: str, width: int = 32, class_name: str = ""):
    """A tiny config of ``model_type`` at ``width`` (hidden size; heads fixed, head size grows)."""
    from transformers import CONFIG_MAPPING

    heads, ffn = 2, 2 * width
    common = dict(
        vocab_size=VOCAB, hidden_size=width, num_hidden_layers=2, num_attention_heads=heads, intermediate_size=ffn,
        max_position_embeddings=256, num_labels=LABELS, d_model=width, d_ff=ffn, d_kv=width // heads,
        num_layers=2, num_decoder_layers=2, num_heads=heads, n_embd=width, n_layer=2, n_head=heads,
        n_inner=ffn, n_positions=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=heads,
        decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, ffn_dim=ffn,
        num_key_value_heads=heads, image_size=16, patch_size=4, num_channels=3,
        embedding_size=width, dim=width, hidden_dim=ffn, n_layers=2, n_heads=heads, attention_heads=heads,
        word_embed_proj_dim=width, rotary_dim=4, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=0, type_vocab_size=2, dropout_rate=0.0, tie_word_embeddings=None,
    )  # fmt: skip
    cfg_cls = CONFIG_MAPPING[model_type]
    special: dict = {
        "gpt_neo": dict(attention_types=[[["global", "local"], 1]], window_size=4, num_layers=2),
        "big_bird": dict(attention_type="original_full"),
        "longt5": dict(local_radius=2, global_block_size=2),
        "resnet": dict(embedding_size=width, hidden_sizes=[width, 2 * width], depths=[1, 1]),
        "regnet": dict(embedding_size=width, hidden_sizes=[width, 2 * width], depths=[1, 1], groups_width=8),
        "whisper": dict(num_mel_bins=8, max_source_positions=8, max_target_positions=16),
        "albert": dict(num_hidden_groups=1, embedding_size=16),
        "wav2vec2": dict(conv_dim=(width, width), conv_kernel=(5, 3), conv_stride=(4, 2), num_conv_pos_embeddings=4,
                         num_conv_pos_embedding_groups=2, num_codevectors_per_group=8, codevector_dim=width,
                         proj_codevector_dim=width, num_codevector_groups=2, do_stable_layer_norm=True,
                         feat_extract_norm="layer"),
        "gemma": dict(head_dim=width // heads),
    }  # fmt: skip
    if model_type == "clip":
        text = {k: v for k, v in common.items() if k in ("vocab_size", "hidden_size", "num_hidden_layers")}
        text |= dict(num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=64)
        vision = dict(hidden_size=width, num_hidden_layers=2, num_attention_heads=heads, intermediate_size=ffn,
                      image_size=16, patch_size=4)  # fmt: skip
        return cfg_cls(text_config=text, vision_config=vision, projection_dim=width)
    defaults = cfg_cls()
    kw = {k: v for k, v in common.items() if hasattr(defaults, k) and v is not None}
    kw |= special.get(model_type, {})
    if "QuestionAnswering" in class_name:
        kw["num_labels"] = 2  # start and end logits
    return cfg_cls(**kw)


def inputs_for(model, model_type: str) -> dict:
    """Example inputs by the first argument the model's ``__call__`` takes."""
    params = list(inspect.signature(type(model).__call__).parameters)
    first = params[1]
    cfg = model.config
    # Tokens 3 ... 52, an end-of-sequence token (2) last (sequence classifiers read it); 0 and 1 never appear.
    ids = (jnp.arange(BATCH * SEQ).reshape(BATCH, SEQ) % (VOCAB // 2) + 3).astype(jnp.int32).at[:, -1].set(2)
    if first == "input_ids":
        x: dict = {"input_ids": ids}
        if "MultipleChoice" in type(model).__name__:
            x["input_ids"] = jnp.stack([ids, ids + 1], axis=1)
        if "pixel_values" in params:
            x["pixel_values"] = jnp.ones((BATCH, 3, 16, 16))
    elif first == "pixel_values":
        x = {"pixel_values": jnp.linspace(-1, 1, BATCH * 3 * 16 * 16).reshape(BATCH, 3, 16, 16)}
    elif first == "input_values":
        x = {"input_values": jnp.sin(jnp.arange(BATCH * 256) / 7.0).reshape(BATCH, 256)}
    elif first == "input_features":
        x = {"input_features": jnp.cos(jnp.arange(BATCH * cfg.num_mel_bins * 16) / 5.0).reshape(BATCH, -1, 16)}
    else:
        raise ValueError(f"unknown first input {first!r}")
    if "decoder_input_ids" in params and first != "input_ids" or model_type in ("t5", "mt5", "longt5"):
        x["decoder_input_ids"] = ids[:, :4]
    return x


def build(class_name: str, model_type: str, width: int = 32):
    """``(model, params, inputs)``: the class at its tiny config, random weights."""
    import transformers

    cls = getattr(transformers, class_name)
    model = cls(tiny_config(model_type, width, class_name), seed=0)
    x = inputs_for(model, model_type)
    return model, model.params, x


# What the loss reads where it is not the first array leaf (as a user says it, with ``output=``): wav2vec2's
# contrastive loss reads its projected states and the quantized targets.
# The pre-training losses read two outputs: the masked-LM logits and the next-sentence / sentence-order logits.
OUTPUTS = {
    "FlaxWav2Vec2ForPreTraining": lambda out: (out.projected_states, out.projected_quantized_states),
    **{f"Flax{m}ForPreTraining": (lambda out: (out[0], out[1])) for m in ("Albert", "Bert", "BigBird")},
}


def logits_of(out, class_name=""):
    """What the loss reads: the first array leaf of a model's output (its logits, the read-out rule's
    default), or the :data:`OUTPUTS` selection; a question-answering loss reads the start and the end logits
    (the oracle sees both; the geometry is left to find the head's two one-column blocks by itself)."""
    if class_name in OUTPUTS:
        return OUTPUTS[class_name](out)
    if class_name.endswith("ForQuestionAnswering"):
        return (out[0], out[1])
    return next(y for y in jax.tree_util.tree_leaves(out) if hasattr(y, "shape"))


def apply_fn(model, **extra):
    """``(params, inputs) -> outputs`` by the model's own ``__call__``, deterministic (no dropout)."""
    names = inspect.signature(type(model).__call__).parameters
    mode = {"train": False} if "train" in names else {"deterministic": True} if "deterministic" in names else {}
    return lambda p, x: model(**x, params=p, **mode, **extra)


def oracle_readouts(model, params, x) -> set[str]:
    """Leaves the logits read directly, from derivatives (no geometry involved): a leaf is a read-out iff
    along one of its axes, a change of the slice at index ``j`` (the last four indices: tokens never in the
    inputs, which use 2 ... 52 and the special tokens 0, 1, 2) changes the logits
    affinely (their second derivative along it is exactly zero) and the logits the indices change are in
    pairwise disjoint sets of columns (last axis), at least two of them not empty: a head's columns,
    its bias, a tied table's rows for tokens not in the input; or a one-column head ``(d, 1)`` and its
    bias, along their last axis. A norm scale before the head changes every
    logit; a hidden layer changes them through a norm or a nonlinearity (a second derivative), or, behind
    a ReLU (piecewise linear: no second derivative), through every live unit into the same columns (a
    dead unit changes none: two of four indices must change some)."""

    def logits(p):
        ys = logits_of(apply_fn(model)(p, x), type(model).__name__)
        return [y.astype(jnp.float32) for y in jax.tree.leaves(ys)]

    @jax.jit
    def derivatives(p, tangent):
        first = lambda q: jax.jvp(logits, (q,), (tangent,))[1]  # noqa: E731
        return jax.jvp(first, (p,), (tangent,))

    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    zeros = [jnp.zeros_like(lf) for _, lf in flat]
    found = set()
    for i, (path, leaf) in enumerate(flat):
        for axis in range(leaf.ndim):
            sets = []
            for j in range(leaf.shape[axis] - 1, max(-1, leaf.shape[axis] - 5), -1):  # the last four indices
                idx = tuple(j if a == axis else slice(None) for a in range(leaf.ndim))
                t = list(zeros)
                t[i] = zeros[i].at[idx].set(jax.random.normal(jax.random.key(i), leaf[idx].shape, leaf.dtype))
                d1, d2 = derivatives(params, jax.tree_util.tree_unflatten(treedef, t))
                if any(np.any(np.asarray(v) != 0) for v in d2):
                    sets = None  # not affine: the change passes through a norm or a nonlinearity
                    break
                # The logits' columns (last axis) it changes.
                sets.append({(k, c) for k, v in enumerate(d1) for c in np.nonzero(np.any(np.asarray(v) != 0,
                             axis=tuple(range(v.ndim - 1))))[0]})  # fmt: skip
            one_column = leaf.shape[-1] == 1 and leaf.ndim <= 2  # a (d, 1) head or its (1,) bias
            live = [s for s in sets or () if s]
            disjoint = sum(len(s) for s in live) == len(set().union(*live)) if live else False
            if live and (len(live) >= 2 and disjoint if len(sets) >= 2 else one_column):
                found.add(_path(path))
                break
    return found


# Classes whose first output is not a layer's logits: their read-outs are not checked by the oracle.
NO_ORACLE = {
    "FlaxCLIPModel": "contrastive logits: cosine similarities of two normalized projections",
    "FlaxWav2Vec2ForPreTraining": "the loss reads the quantizer's gathered codebook through project_q, which the "
    "perturbation cannot tell from a head's columns",
}


def frozen_leaves(model, params, x) -> set[str]:
    """Leaves the logits' gradient never reaches (``jax.lax.stop_gradient``: BART's ``final_logits_bias``)."""
    ys = lambda p: logits_of(apply_fn(model)(p, x), type(model).__name__)  # noqa: E731
    r = jax.tree.map(lambda y: jax.random.normal(jax.random.key(1), y.shape), jax.eval_shape(ys, params))
    g = jax.jit(jax.grad(lambda p: sum(jnp.vdot(a.astype(jnp.float32), b) for a, b in zip(jax.tree.leaves(ys(p)),
                                                                                     jax.tree.leaves(r)))))(params)  # fmt: skip
    return {_path(k) for k, v in jax.tree_util.tree_flatten_with_path(g)[0] if not np.any(np.asarray(v) != 0)}


def is_base_model(class_name: str) -> bool:
    """A class without a head (``FlaxBertModel``): its first output is a hidden state, not logits."""
    return class_name.endswith("Model") and not any(k in class_name for k in ("LMHead", "MTModel", "CLIP"))


def _path(path) -> str:
    """The '/'-joined key path of a leaf, as ``GeometryMap``'s leaf names."""
    return "/".join(str(next((getattr(k, a) for a in ("key", "name", "idx") if hasattr(k, a)), k)) for k in path)


def geometry_checks(model, params, x) -> dict:
    """``{'leaves', 'undecided', 'warned', 'readout_wrong', 'gmap'}`` on the model route."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", so.GeometryWarning)
        name = type(model).__name__
        # A headless model's loss is the user's: the tier says it reads the last hidden state.
        sel = OUTPUTS.get(name) or ((lambda out: out[0]) if is_base_model(name) else None)
        run = apply_fn(model)
        if "output" in inspect.signature(so.GeometryMap.from_apply).parameters:
            gmap = so.GeometryMap.from_apply(run, params, x, output=sel)
        else:  # a package without output= (the "before" count): the selection traced as the model's output
            gmap = so.GeometryMap.from_apply(run if sel is None else (lambda p, x: sel(run(p, x))), params, x)
        leaves = gmap.leaves(params)
    undecided = sorted(p for p, g in leaves if g.kind == "elementwise")
    warned = sorted({str(w.message)[:160] for w in rec if issubclass(w.category, so.GeometryWarning)})
    got = {p for p, g in leaves if g.role == "output"}
    name = type(model).__name__
    truth = got if is_base_model(name) or name in NO_ORACLE else oracle_readouts(model, params, x)
    frozen = frozen_leaves(model, params, x)  # no derivative reaches them (stop_gradient): the oracle is blind
    wrong = sorted(((got - truth) | (truth - got)) - frozen)
    return dict(leaves=len(leaves), undecided=undecided, warned=warned, readout_wrong=wrong, gmap=gmap,
                readouts=sorted(got), truth=sorted(truth))  # fmt: skip


def step_checks(params, gmap) -> list[str]:
    """One step of muon, moga and mup_adamw on random gradients: runs, keeps dtypes, moves every leaf."""
    problems = []
    grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(p.size), p.shape, p.dtype), params)
    for name, tx in (
        ("muon", so.muon(0.02, geometry=gmap)),
        ("moga", so.moga(0.02, geometry=gmap)),
        ("mup_adamw", so.mup_adamw(0.01, geometry=gmap)),
    ):
        try:
            upd, _ = jax.jit(tx.update)(grads, tx.init(params), params)
        except Exception as e:  # noqa: BLE001 - reported as a problem
            problems.append(f"{name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        for (path, u), p in zip(jax.tree_util.tree_flatten_with_path(upd)[0], jax.tree.leaves(params)):
            if u.dtype != p.dtype:
                problems.append(f"{name}: {_path(path)} dtype {u.dtype} != {p.dtype}")
            elif not np.all(np.isfinite(np.asarray(u))) or not np.any(np.asarray(u) != 0):
                problems.append(f"{name}: {_path(path)} not moved (or not finite)")
    return problems


@contextlib.contextmanager
def jax_compat():
    """transformers 4.46's Flax T5 / mT5 / LongT5 call ``jnp.clip(x, a_min=, a_max=)``, keywords that
    JAX 0.10 removed (``min`` / ``max`` now): accepted again while the tier runs, nothing else changed."""
    orig = jnp.clip
    if "a_max" in inspect.signature(orig).parameters:
        yield
        return

    def clip(x, min=None, max=None, *, a_min=None, a_max=None, **kw):  # noqa: A002
        return orig(x, a_min if min is None else min, a_max if max is None else max, **kw)

    jnp.clip = clip
    try:
        yield
    finally:
        jnp.clip = orig


def check_class(model_type: str, class_name: str, steps: bool = True) -> dict:
    with jax_compat():
        model, params, x = build(class_name, model_type)
        res = geometry_checks(model, params, x)
        res["steps"] = step_checks(params, res["gmap"]) if steps else []
    return res


def coord_check(class_name: str, model_type: str, optimizer: str, widths=(32, 64, 128), seed: int = 0) -> dict:
    """muP's yardstick on a real class: from Parametrization-1 init (``reinitialize`` on the traced
    geometry), one step of ``optimizer`` (``'muon'``, ``'moga'``, ``'mup_adamw'``, the same learning rate at
    every width) on the cross-entropy of fixed labels; per layer (the model's ``hidden_states`` and the
    logits) the change of its output, ``rms(h1 - h0) / rms(h0)`` (the logits: ``rms(f1 - f0)``), per width.
    Flat in width when every leaf's geometry and role are right; a hidden layer read out, or a wrong
    fan-in, shows as a slope. Returns ``{layer: [change per width]}``."""
    import optax

    table: dict[str, list[float]] = {}
    base = None
    with jax_compat():
        for w in widths:
            model, params, x = build(class_name, model_type, w)
            gmap = so.GeometryMap.from_apply(apply_fn(model), params, x)
            params = so.initializers.reinitialize(jax.random.key(seed), params, gmap)
            base = base if base is not None else jax.eval_shape(lambda p: p, params)
            run = apply_fn(model, output_hidden_states=True)

            def feats(p, run=run, x=x):
                out = run(p, x)
                return list(out.hidden_states) + [logits_of(out)]

            def loss(p, run=run, x=x):
                y = logits_of(run(p, x)).astype(jnp.float32)
                labels = jnp.arange(y.size // y.shape[-1]).reshape(y.shape[:-1]) % y.shape[-1]
                return optax.softmax_cross_entropy_with_integer_labels(y, labels).mean()

            tx = {
                "muon": lambda: so.muon(0.02, geometry=gmap),
                "moga": lambda: so.moga(0.02, geometry=gmap),
                "mup_adamw": lambda: so.mup_adamw(0.01, base=base, geometry=gmap, weight_decay=0.0),
            }[optimizer]()
            grads = jax.jit(jax.grad(loss))(params)
            upd, _ = jax.jit(tx.update)(grads, tx.init(params), params)
            f = jax.jit(feats)
            h0, h1 = f(params), f(optax.apply_updates(params, upd))
            for k, (a, b) in enumerate(zip(h0, h1)):
                name = "logits" if k == len(h0) - 1 else f"h{k}"
                rms = lambda v: float(jnp.sqrt(jnp.mean(jnp.square(v.astype(jnp.float32)))))  # noqa: E731
                table.setdefault(name, []).append(rms(b - a) / (1.0 if name == "logits" else rms(a)))
    return table


def problems_of(res: dict) -> list[str]:
    out = [f"undecided {p}" for p in res["undecided"]]
    out += [f"warned: {w}" for w in res["warned"]]
    out += [f"read-out wrong: {p}" for p in res["readout_wrong"]]
    out += res["steps"]
    return out


def main(argv) -> None:
    names = [a for a in argv if not a.startswith("--")]
    types = {c: t for t, c in flax_classes()}
    classes = [(types[c], c) for c in names if c in types] if names else flax_classes()
    n_cls = n_leaves = n_prob = n_bad = n_fail = 0
    for t, c in classes:
        if t in COMPOSITE:
            print(f"SKIP {c}: {COMPOSITE[t]}")
            continue
        try:
            res = check_class(t, c, steps="--no-steps" not in argv)
        except Exception as e:  # noqa: BLE001
            n_fail += 1
            print(f"FAIL {c}: {type(e).__name__}: {str(e)[:300]}")
            continue
        n_cls += 1
        n_leaves += res["leaves"]
        probs = problems_of(res)
        n_prob += len(probs)
        n_bad += bool(probs)
        print(f"{'ok  ' if not probs else 'BAD '} {c}: {res['leaves']} leaves, read-outs {res['readouts']}")
        for p in probs:
            print("      ", p)
        sys.stdout.flush()
    print(f"classes {n_cls} (+{n_fail} failed to build), leaves {n_leaves}, problems {n_prob} in {n_bad} classes")


if __name__ == "__main__":
    main(sys.argv[1:])
