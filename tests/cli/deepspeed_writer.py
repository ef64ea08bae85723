"""Writes GPT-NeoX checkpoints the way DeepSpeed's PipelineEngine saves them with ZeRO stage
1 or 2 (our own code, from reading DeepSpeed's engine.py, pipe/module.py, zero/stage_1_and_2.py
and utils/zero_to_fp32.py):

    <root>/latest                                       the tag's name
    <root>/global_stepN/layer_LL-model_TT-model_states.pt  one layer's state dict (tp rank TT)
    <root>/global_stepN/mp_rank_XX_model_states.pt      XX = stage * tp + tp rank: client state,
                                                        module None, param_shapes per group
    <root>/global_stepN/zero_pp_rank_D_mp_rank_XX_optim_states.pt
        dp rank D's slice of every parameter group, flattened in param_shapes' order, padded to
        a multiple of 2 * dp and cut into dp equal parts; the fp32 slices saved without the
        padding, the Adam moments with it.

The classes DeepSpeed pickles into these files (its loss scaler, ZeroStageEnum,
fragment_address) are stood in for under their real module names, so the files hold the very
globals real ones do.
"""
import collections
import enum
import os
import random
import sys
import types

import numpy
import torch


def _module(name):
    parts = name.split(".")
    for i in range(1, len(parts)):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    m = sys.modules.get(name) or types.ModuleType(name)
    sys.modules[name] = m
    return m


_ls = _module("deepspeed.runtime.fp16.loss_scaler")
DynamicLossScaler = type("DynamicLossScaler", (), {"__module__": _ls.__name__})
_ls.DynamicLossScaler = DynamicLossScaler
_tf = _module("deepspeed.utils.tensor_fragment")
fragment_address = type("fragment_address", (), {"__module__": _tf.__name__})
_tf.fragment_address = fragment_address
_zc = _module("deepspeed.runtime.zero.config")
ZeroStageEnum = enum.IntEnum("ZeroStageEnum", {"disabled": 0, "optimizer_states": 1, "gradients": 2, "weights": 3}, module=_zc.__name__)
_zc.ZeroStageEnum = ZeroStageEnum


def neox_pipeline_model(seed, hidden=8, vocab=16):
    """GPT-NeoX's pipeline: layer index -> {key: (whole fp32 tensor, tp split dim or -1)}. Index 0
    is the embedding, 2 and 3 transformer layers, 5 the final norm, 6 the output layer (1 and 4
    are NeoX's parameterless pre/post blocks)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g)
    block = lambda: {"input_layernorm.weight": (r(hidden), -1), "input_layernorm.bias": (r(hidden), -1),
                     "attention.query_key_value.weight": (r(3 * hidden, hidden), 0), "attention.query_key_value.bias": (r(3 * hidden), 0),
                     "attention.dense.weight": (r(hidden, hidden), 1), "attention.dense.bias": (r(hidden), -1),
                     "mlp.dense_h_to_4h.weight": (r(4 * hidden, hidden), 0), "mlp.dense_4h_to_h.weight": (r(hidden, 4 * hidden), 1),
                     "mlp.dense_4h_to_h.bias": (r(hidden), -1)}
    return {0: {"word_embeddings.weight": (r(vocab, hidden), 0)}, 2: block(), 3: block(),
            5: {"norm.weight": (r(hidden), -1), "norm.bias": (r(hidden), -1)}, 6: {"final_linear.weight": (r(vocab, hidden), 0)}}


STAGES = {2: [[0, 2], [3, 5, 6]], 1: [[0, 2, 3, 5, 6]]}


def shard(t, dim, rank, tp):
    return t if dim < 0 else t.chunk(tp, dim)[rank].clone()


def moments(model, L, k):
    """Adam's two moments of a whole parameter (replicated ones are equal on every tp rank, as
    in training, where every rank sees the same gradient for them)."""
    g = torch.Generator().manual_seed(1000 * L + sorted(model[L]).index(k))
    x = model[L][k][0]
    return torch.randn(x.shape, generator=g), torch.rand(x.shape, generator=g)


def write(root, model, tp, pp, dp, iteration, stage=2, bf16=False, elastic=False, bad=None):
    """The checkpoint; returns the tag folder. Also returns, through the model's layout, what a
    reader must find: see expected()."""
    tag = os.path.join(root, f"global_step{iteration}")
    os.makedirs(tag)
    for t in range(tp):
        for layer, params in model.items():
            sd = collections.OrderedDict((k, shard(x, d, t, tp).half()) for k, (x, d) in params.items())
            if bad == "layer_dtype" and (t, layer) == (1, 2):
                sd["attention.dense.weight"] = sd["attention.dense.weight"].float()
            torch.save(sd, os.path.join(tag, f"layer_{layer:02d}-model_{t:02d}-model_states.pt"))
    for p in range(pp):
        for t in range(tp):
            xx = p * tp + t
            # Two groups, as NeoX makes them: weights with weight decay, biases and norms without.
            names = [(f"{L}.{k}", L, k) for L in STAGES[pp][p] for k in model[L]]
            groups = [[n for n in names if n[2].endswith("weight") and "norm" not in n[2]],
                      [n for n in names if not (n[2].endswith("weight") and "norm" not in n[2])]]
            shapes = [collections.OrderedDict((n, shard(model[L][k][0], model[L][k][1], t, tp).shape) for n, L, k in grp) for grp in groups]
            random.seed(70 + xx)
            torch.save({"module": None, "buffer_names": [], "optimizer": None, "param_shapes": shapes, "frozen_param_shapes": None,
                        "shared_params": {}, "frozen_param_fragments": None, "lr_scheduler": None, "data_sampler": None,
                        "random_ltd": None, "sparse_tensor_module_names": set(), "skipped_steps": 1, "global_steps": iteration,
                        "global_samples": iteration * 32, "dp_world_size": dp, "mp_world_size": tp * pp, "ds_config": {"train_batch_size": 32},
                        "ds_version": "0.16.5", "iteration": iteration, "args": {"num_layers": 2, "hidden_size": 8, "pipe_parallel_size": pp},
                        "random_rng_state": random.getstate(), "np_rng_state": numpy.random.RandomState(80 + xx).get_state(),
                        "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.full((16,), xx, dtype=torch.uint8),
                        "rng_tracker_states": {"model-parallel-rng": torch.full((16,), 30 + xx, dtype=torch.uint8)}},
                       os.path.join(tag, f"mp_rank_{xx:02d}_model_states.pt"))
            # The flat groups: fp32 masters and Adam's moments, padded, cut into dp parts.
            flat = []
            for gi, grp in enumerate(groups):
                cut = lambda x, L, k: shard(x, model[L][k][1], t, tp).reshape(-1)
                master = torch.cat([cut(model[L][k][0], L, k) for _, L, k in grp])
                m1 = torch.cat([cut(moments(model, L, k)[0], L, k) for _, L, k in grp])
                m2 = torch.cat([cut(moments(model, L, k)[1], L, k) for _, L, k in grp])
                pad = -len(master) % (2 * dp)
                flat.append([torch.cat([x, torch.zeros(pad)]) for x in (master, m1, m2)] + [pad])
            for d in range(dp):
                fp32, state, paddings, mappings = [], {}, [], []
                for gi, (master, m1, m2, pad) in enumerate(flat):
                    size = len(master) // dp
                    lo, hi = d * size, (d + 1) * size
                    last = d == dp - 1
                    fp32.append(master[lo:hi - (pad if last else 0)].clone())  # DeepSpeed drops the padding
                    if elastic:
                        state[gi] = {"exp_avg": m1[lo:hi - (pad if last else 0)].clone(), "exp_avg_sq": m2[lo:hi - (pad if last else 0)].clone()}
                    else:
                        state[gi] = {"step": torch.tensor(float(iteration)), "exp_avg": m1[lo:hi].clone(), "exp_avg_sq": m2[lo:hi].clone()}
                    paddings.append(pad if last else 0)
                    fa = fragment_address()
                    fa.numel, fa.start = hi - lo, 0
                    mappings.append(collections.OrderedDict([(groups[gi][0][0], fa)]))
                if bad == "short" and (xx, d) == (1, dp - 1):
                    fp32[0] = fp32[0][:-3]
                if elastic:
                    base = [state[gi] for gi in range(len(flat))]
                else:
                    base = {"state": state, "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": wd,
                                                              "params": [gi]} for gi, wd in enumerate((0.01, 0.0))]}
                scaler = DynamicLossScaler()
                scaler.cur_scale, scaler.cur_iter, scaler.scale_factor = 4096.0, iteration, 2.0
                osd = {"loss_scaler": scaler, "dynamic_loss_scale": True, "overflow": False, "clip_grad": 1.0,
                       "base_optimizer_state": base, "single_partition_of_fp32_groups": fp32,
                       "group_paddings": paddings, "partition_count": [dp, dp], "ds_version": "0.16.5", "param_slice_mappings": mappings}
                if not bf16:
                    osd["zero_stage"] = ZeroStageEnum(stage)
                prefix = "bf16_" if bf16 else ""
                torch.save({"optimizer_state_dict": osd, "ds_config": {"train_batch_size": 32}, "ds_version": "0.16.5"},
                           os.path.join(tag, f"{prefix}zero_pp_rank_{d}_mp_rank_{xx:02d}_optim_states.pt"))
    with open(os.path.join(root, "latest"), "w") as f:
        f.write(f"global_step{iteration}")
    return tag


def expected(model):
    """What the import must hold, as global tensors: the fp16 weights under "LL.key" and, for
    every parameter, optimizer.state.{fp32_param,exp_avg,exp_avg_sq}.LL.key."""
    out = {}
    for L, params in model.items():
        for k, (x, d) in params.items():
            m1, m2 = moments(model, L, k)
            out.update({f"{L}.{k}": x.half(), f"optimizer.state.fp32_param.{L}.{k}": x,
                        f"optimizer.state.exp_avg.{L}.{k}": m1, f"optimizer.state.exp_avg_sq.{L}.{k}": m2})
    return out
