"""What the model FLOPs formula needs to know about a transformer, read off the model itself.

``6N + 12·L·H·Q·T`` model FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B; the
analysis side is diagnostics/facts/mfu.py): N the parameters that do arithmetic on every
token, L layers, H attention heads, Q the head dimension. :func:`model_shape` takes any
``torch.nn.Module`` and a config object with HF's attribute names (``num_hidden_layers``,
``num_attention_heads``, ``hidden_size``; GPT-2's ``n_layer`` and friends answer to them
through ``attribute_map``), so a framework integration other than HF's can use it as is.

N is every unique parameter (``parameters()`` already yields a tied weight once) less the
weights of ``torch.nn.Embedding`` modules: a lookup does no arithmetic. An embedding weight
that another module also holds is kept: that is a tied output projection (GPT-2's
``lm_head.weight is transformer.wte.weight``, BERT's masked-LM decoder), a matmul of h·V
multiply-adds on every token, which nanoGPT's ``estimate_mfu`` counts too.

No shape rather than a wrong one: a sizing attribute missing or not a positive integer,
heads that do not divide the width without a ``head_dim``, an encoder-decoder (one L for
two stacks and cross-attention) or a mixture of experts (N counts every expert, a token
uses a few) give the reason instead.

The precision settings the peak depends on are recorded beside the shape, as the run's
AMP summary cannot tell them: the dtype most parameter elements are in (a model loaded in
bf16 runs its matmuls in bf16 without autocast) and whether fp32 matmuls may use TF32.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

# config attributes that say a model routes each token to a few of many experts
_EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def non_embedding_parameters(model: torch.nn.Module) -> int:
    """The parameters that do arithmetic on every token: every unique parameter less the
    embedding tables, a table that is also another module's weight (a tied output
    projection) counted once."""
    table_ids: set[int] = set()
    held_elsewhere: set[int] = set()
    for module in model.modules():
        # a tied weight is in both modules' own _parameters, though parameters() yields it once
        for parameter in module.parameters(recurse=False):
            if isinstance(module, torch.nn.Embedding):
                table_ids.add(id(parameter))
            else:
                held_elsewhere.add(id(parameter))
    lookups_only = table_ids - held_elsewhere
    return sum(p.numel() for p in model.parameters() if id(p) not in lookups_only)


def parameter_dtype(model: torch.nn.Module) -> str | None:
    """The dtype most parameter elements are in (``float32``, ``bfloat16``), None without
    parameters."""
    elements: Counter[str] = Counter()
    for parameter in model.parameters():
        elements[str(parameter.dtype).removeprefix("torch.")] += parameter.numel()
    return elements.most_common(1)[0][0] if elements else None


def fp32_matmul_precision() -> str | None:
    """``tf32`` when CUDA fp32 matmuls may use TF32, else ``ieee``; None if torch will not
    say. The per-backend setting answers for both of torch's APIs (``allow_tf32`` and
    ``set_float32_matmul_precision`` set it too); the old getter raises once the two were
    mixed, which HF's ``tf32=`` argument and a script's own call can do."""
    matmul = torch.backends.cuda.matmul
    try:
        setting = getattr(matmul, "fp32_precision", None)
        if setting is None:  # torch before 2.9: only the legacy flag
            return "tf32" if matmul.allow_tf32 else "ieee"
        if setting == "none":  # inherits the generic setting
            setting = getattr(torch.backends, "fp32_precision", "ieee")
        return "tf32" if setting == "tf32" else "ieee"
    except RuntimeError:
        return None


def model_shape(model: torch.nn.Module, config: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The model's ``{model_type, non_embedding_params, layers, heads, head_dim,
    vocab_size, parameter_dtype, fp32_matmul}``, or None and why it is not given."""
    if config is None:
        return None, "the model has no config"
    if getattr(config, "is_encoder_decoder", False) is True:
        return None, "an encoder-decoder model: one layer count cannot size both stacks"
    for name in _EXPERT_COUNTS:
        experts = _positive_int(getattr(config, name, None))
        if experts is not None and experts > 1:
            return None, f"a mixture of experts ({name}={experts}): a token uses only a few"
    sizes = {
        name: getattr(config, name, None)
        for name in ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size")
    }
    unusable = sorted(name for name, value in sizes.items() if _positive_int(value) is None)
    if unusable:
        return None, f"the config's {', '.join(unusable)} is not a positive integer"
    heads, hidden = sizes["num_attention_heads"], sizes["hidden_size"]
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None:
        if hidden % heads:
            return None, f"hidden_size {hidden} is not a multiple of {heads} heads"
        head_dim = hidden // heads
    elif _positive_int(head_dim) is None:
        return None, f"the config's head_dim {head_dim!r} is not a positive integer"
    params = non_embedding_parameters(model)
    if params <= 0:
        return None, "the model has no parameters outside its embedding tables"
    model_type = getattr(config, "model_type", None)
    return {
        "model_type": model_type if isinstance(model_type, str) and model_type else None,
        "non_embedding_params": params,
        "layers": sizes["num_hidden_layers"],
        "heads": heads,
        "head_dim": head_dim,
        "vocab_size": sizes["vocab_size"],
        "parameter_dtype": parameter_dtype(model),
        "fp32_matmul": fp32_matmul_precision(),
    }, None
